from torchvision.transforms.v2.functional import *  # noqa: F401,F403
from torchvision.transforms.v2.functional import InterpolationMode, pil_to_tensor  # noqa: F401


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise NotImplementedError(f"torchvision {name} is not in omniray's stand-in (install torchvision)")

    missing.__name__ = name
    return missing
