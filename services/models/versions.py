"""Model versions that travel with every feature tensor: which encoder made it, which projector
mapped it, and which LLM it was projected for. A consumer that expects other versions rejects it.

A version is a digest of the model's prepared files (its manifest), or of a mounted checkpoint's
config.json, so two processes that serve the same weights agree without talking to each other.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from services.models.build import MANIFEST
from services.models.profile import ModelSpec, Profile


def model_version(profile: Profile, spec: ModelSpec | None) -> str:
    if spec is None:
        return "none"
    path = profile.model_path(spec)
    source = path / MANIFEST if (path / MANIFEST).exists() else path / "config.json"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12] if source.exists() else "missing"
    return f"{spec.adapter}@{digest}"


@dataclass(frozen=True)
class FeatureVersions:
    encoder: str
    projector: str
    llm: str

    def encode(self) -> str:
        return f"encoder={self.encoder};projector={self.projector};llm={self.llm}"

    @classmethod
    def parse(cls, text: str) -> FeatureVersions:
        fields = dict(part.partition("=")[::2] for part in text.split(";") if part)
        return cls(fields.get("encoder", ""), fields.get("projector", ""), fields.get("llm", ""))

    @classmethod
    def for_profile(cls, profile: Profile, modality: str) -> FeatureVersions:
        """What this deployment's features of `modality` must carry. The projector into the
        thinker's embedding space is part of the encoder model in every profile so far."""
        spec = profile.models.vision if modality == "image" else profile.models.audio
        encoder = model_version(profile, spec)
        return cls(encoder=encoder, projector=encoder, llm=model_version(profile, profile.models.thinker))


class FeatureVersionMismatch(ValueError):
    """Features made for other model versions; the gateway re-encodes and retries."""

    CODE = "feature_version_mismatch"

    def __init__(self, found: str, expected: str):
        super().__init__(f"{self.CODE}: feature tensor has {found!r}, this stage expects {expected!r}")
        self.found, self.expected = found, expected

    def __reduce__(self):
        return (FeatureVersionMismatch, (self.found, self.expected))
