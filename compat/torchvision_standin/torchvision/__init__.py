"""A stand-in for the parts of torchvision transformers' image processors use (CPU torch only)."""

__version__ = "0.0.0+standin"
from torchvision import io, transforms  # noqa: F401,E402


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise NotImplementedError(f"torchvision {name} is not in omniray's stand-in (install torchvision)")

    missing.__name__ = name
    return missing
