"""Urgency policies for the engine scheduler (services/extensions/vllm/scheduler.py) and the speech
stages' gate, as plugins (plugins.Registry's shape): one file each with typed `PARAMS` and
`create(params, piece_tokens)`; the profile names one (`realtime.scheduler`). `piece_tokens` is the
deployment's, not a tuning knob: how many tokens a reply may generate before their audio can come
(Profile.audio_piece_tokens)."""

from __future__ import annotations

from plugins import Registry
from services.policies.urgency.base import HELD, Candidate, Classified, Pace, Ranking, UrgencyPolicy

POLICIES: Registry[UrgencyPolicy] = Registry(
    "urgency policy",
    {"fcfs": "services.policies.urgency.fcfs", "liveserve": "services.policies.urgency.liveserve"},
)
create = POLICIES.create

__all__ = ["HELD", "POLICIES", "Candidate", "Classified", "Pace", "Ranking", "UrgencyPolicy", "create"]
