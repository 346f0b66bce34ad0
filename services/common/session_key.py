"""The name of a client's session, scoped by its tenant: what the playback board, the engines'
scheduler and the KV store's page chains know it by (`RequestContext.session_id`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SessionKey:
    tenant: str
    name: str  # the client's own session name (REST/gRPC header) or a realtime session's id

    def __str__(self) -> str:
        return f"{self.tenant}/{self.name}"
