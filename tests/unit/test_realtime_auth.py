"""Client-secret requests and the browser WebSocket's key subprotocol (services/gateway/realtime/auth.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.common.errors import OmniError
from services.gateway.realtime.auth import ClientSecretRequest, session_settings, subprotocol_key
from services.models.profile import load_profile


@pytest.fixture(scope="module")
def profile():
    return load_profile("tiny")


def test_the_key_comes_from_its_subprotocol():
    assert subprotocol_key(["realtime", "openai-insecure-api-key.ek_abc"]) == "ek_abc"
    assert subprotocol_key(["realtime"]) is None
    assert subprotocol_key(["openai-insecure-api-key."]) is None


def test_defaults_and_bounds():
    asked = ClientSecretRequest.model_validate({})
    assert asked.expires_after.seconds == 600 and asked.session == {}
    for seconds in (9, 7201):
        with pytest.raises(ValidationError):
            ClientSecretRequest.model_validate({"expires_after": {"seconds": seconds}})


def test_settings_are_checked_when_minted(profile):
    ok = session_settings({"instructions": "hi", "audio": {"output": {"voice": "alloy"}}}, profile)
    assert ok.instructions == "hi"
    for session, param in (
        ({"audio": {"output": {"voice": "nobody"}}}, "session.audio.output.voice"),
        ({"model": "other"}, "session.model"),
        ({"max_output_tokens": 10**9}, "session.max_output_tokens"),
        ({"output_modalities": ["video"]}, "session.output_modalities.0"),
    ):
        with pytest.raises(OmniError) as refused:
            session_settings(session, profile)
        assert refused.value.status == 422 and refused.value.param == param, refused.value.message
