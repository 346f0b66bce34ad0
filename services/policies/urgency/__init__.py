"""Urgency policies for the engine scheduler (services/extensions/vllm/scheduler.py): one file each, with a
typed parameter struct and `create(**params)`; the profile names one (`realtime.scheduler`)."""

from __future__ import annotations

from importlib import import_module

from services.policies.urgency.base import Candidate, Ranking, UrgencyPolicy

POLICIES = ("fcfs", "liveserve")


def create(name: str, params: dict | None = None) -> UrgencyPolicy:
    if name not in POLICIES:
        raise ValueError(f"unknown urgency policy {name!r}; known: {', '.join(POLICIES)}")
    return import_module(f"services.policies.urgency.{name}").create(**(params or {}))


__all__ = ["POLICIES", "Candidate", "Ranking", "UrgencyPolicy", "create"]
