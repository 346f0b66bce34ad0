"""How a browser authenticates to realtime: ephemeral client secrets (`POST
/v1/realtime/client_secrets`, OpenAI's request and answer) and the key carried in a WebSocket
subprotocol (a browser's WebSocket cannot send an `Authorization` header); the session settings sent
ahead of a session (a secret's, a WebRTC call form's) and how they are checked."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.common.errors import OmniError
from services.models.profile import Profile
from services.quota.client_secrets import DEFAULT_TTL_S, MAX_TTL_S, MIN_TTL_S
from services.realtime import events as ev
from services.realtime.settings import unserved

# OpenAI's browser WebSocket: `new WebSocket(url, ["realtime", "openai-insecure-api-key." + key])`;
# the server answers with the `realtime` subprotocol.
SUBPROTOCOL = "realtime"
KEY_SUBPROTOCOL = "openai-insecure-api-key."


class ExpiresAfter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    anchor: Literal["created_at"] = "created_at"
    seconds: int = Field(DEFAULT_TTL_S, ge=MIN_TTL_S, le=MAX_TTL_S)


class ClientSecretRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    expires_after: ExpiresAfter = Field(default_factory=ExpiresAfter)
    session: dict = Field(default_factory=dict)


def session_settings(session: dict, profile: Profile) -> ev.SessionConfig:
    """Session settings sent ahead of the session (a client secret's, a WebRTC call form's),
    checked now (a 422 naming the field) rather than when the session opens: their shape, size,
    model, voice and token cap (tools and input transcription are checked when the session opens,
    as a `session.update`'s)."""
    if len(json.dumps(session)) > ev.MAX_SESSION_BYTES:  # a secret's stay in Redis for its life
        raise OmniError(413, f"session settings are larger than {ev.MAX_SESSION_BYTES} bytes",
                        code="request_too_large", param="session")  # fmt: skip
    try:
        config = ev.SessionConfig.model_validate(session)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(["session", *(str(p) for p in first["loc"])])
        raise OmniError(422, f"{param}: {first['msg']}", code="invalid_value", param=param) from None
    if refused := unserved(config, profile):  # the first, as a validation error names one
        field, why = refused[0]
        param = ".".join(["session", *field])
        raise OmniError(
            422, why, code="model_not_found" if field == ("model",) else "invalid_value", param=param
        )
    return config


def subprotocol_key(subprotocols: list[str]) -> str | None:
    """The API key or client secret a browser put in its WebSocket subprotocols, if any."""
    for proto in subprotocols:
        if proto.startswith(KEY_SUBPROTOCOL):
            return proto[len(KEY_SUBPROTOCOL) :] or None
    return None
