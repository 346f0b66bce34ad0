import enum
import io as _io

import numpy as np
import torch


class ImageReadMode(enum.Enum):
    UNCHANGED = 0
    GRAY = 1
    GRAY_ALPHA = 2
    RGB = 3
    RGB_ALPHA = 4


def decode_image(data, mode=ImageReadMode.UNCHANGED):
    from PIL import Image

    raw = bytes(data.numpy().tobytes()) if isinstance(data, torch.Tensor) else bytes(data)
    image = Image.open(_io.BytesIO(raw))
    if mode == ImageReadMode.RGB:
        image = image.convert("RGB")
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)


def read_video(*args, **kwargs):
    raise NotImplementedError("video decoding needs torchvision")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise NotImplementedError(f"torchvision {name} is not in omniray's stand-in (install torchvision)")

    missing.__name__ = name
    return missing
