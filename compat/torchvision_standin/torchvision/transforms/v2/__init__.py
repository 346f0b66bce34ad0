from torchvision.transforms.v2 import functional  # noqa: F401


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise NotImplementedError(f"torchvision {name} is not in omniray's stand-in (install torchvision)")

    missing.__name__ = name
    return missing
