import enum

import numpy as np
import torch
import torch.nn.functional as F


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


_MODES = {
    InterpolationMode.NEAREST: "nearest",
    InterpolationMode.NEAREST_EXACT: "nearest-exact",
    InterpolationMode.BILINEAR: "bilinear",
    InterpolationMode.BICUBIC: "bicubic",
}


def pil_to_tensor(image):
    array = np.asarray(image).copy()
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array).permute(2, 0, 1)


def to_tensor(image):
    return pil_to_tensor(image).float() / 255


def resize(image, size, interpolation=InterpolationMode.BILINEAR, max_size=None, antialias=True):
    mode = _MODES.get(interpolation)
    if mode is None:
        raise NotImplementedError(f"resize with {interpolation} needs torchvision")
    x = image if image.is_floating_point() else image.float()
    batched = x.reshape(-1, *x.shape[-3:])
    out = F.interpolate(
        batched,
        size=list(size),
        mode=mode,
        antialias=antialias and mode in ("bilinear", "bicubic"),
        align_corners=False if mode in ("bilinear", "bicubic") else None,
    )
    out = out.reshape(*x.shape[:-2], *out.shape[-2:])
    if not image.is_floating_point():
        out = out.round().clamp(0, 255).to(image.dtype)
    return out


def normalize(tensor, mean, std, inplace=False):
    mean = torch.as_tensor(mean, dtype=tensor.dtype).view(-1, 1, 1)
    std = torch.as_tensor(std, dtype=tensor.dtype).view(-1, 1, 1)
    return (tensor - mean) / std


def crop(image, top, left, height, width):
    return image[..., top : top + height, left : left + width]


def pad(image, padding, fill=0, padding_mode="constant"):
    if isinstance(padding, int):
        padding = [padding] * 4
    elif len(padding) == 2:
        padding = [padding[0], padding[1], padding[0], padding[1]]
    left, top, right, bottom = padding
    return F.pad(image, [left, right, top, bottom], mode=padding_mode, value=fill)


def grayscale_to_rgb(image):
    return image.expand(*image.shape[:-3], 3, *image.shape[-2:]) if image.shape[-3] == 1 else image


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise NotImplementedError(f"torchvision {name} is not in omniray's stand-in (install torchvision)")

    missing.__name__ = name
    return missing
