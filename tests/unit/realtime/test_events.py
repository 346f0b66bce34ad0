"""Realtime client events: every known type parses into its class; anything else is an error that
names what is wrong (never an exception the session does not expect)."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.realtime import events as ev
from services.realtime.codecs import InputAudio


def test_known_events_parse_into_their_classes():
    audio = base64.b64encode(b"\x00\x01" * 10).decode()
    cases = {
        "session.update": ({"session": {"type": "realtime", "instructions": "be brief"}}, ev.SessionUpdate),
        "input_audio_buffer.append": ({"audio": audio}, ev.InputAudioBufferAppend),
        "input_image_buffer.append": ({"image_url": "data:image/png;base64,AAAA"}, ev.InputImageBufferAppend),
        "input_audio_buffer.commit": ({}, ev.InputAudioBufferCommit),
        "input_audio_buffer.clear": ({}, ev.InputAudioBufferClear),
        "response.create": ({"response": {"output_modalities": ["text"]}}, ev.ResponseCreate),
        "response.cancel": ({}, ev.ResponseCancel),
        "conversation.item.truncate": (
            {"item_id": "i", "content_index": 0, "audio_end_ms": 5},
            ev.ConversationItemTruncate,
        ),
        "conversation.item.retrieve": ({"item_id": "i"}, ev.ConversationItemRetrieve),
        "omniray.playback.progress": ({"item_id": "i", "played_ms": 120.5}, ev.PlaybackProgress),
        "conversation.item.create": (
            {
                "previous_item_id": "root",
                "item": {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            },
            ev.ConversationItemCreate,
        ),
        "conversation.item.delete": ({"item_id": "i"}, ev.ConversationItemDelete),
        "output_audio_buffer.clear": ({}, ev.OutputAudioBufferClear),
    }
    assert set(cases) == ev.CLIENT_TYPES
    extension = {"omniray": {"seed": -(2**63), "speculative_prefill": False}}
    config, _, refused = ev.updated(ev.SessionConfig(), extension)
    assert config.omniray.seed == -(2**63) and config.omniray.speculative_prefill is False and not refused

    for kind, (fields, cls) in cases.items():
        parsed = ev.parse_client_event(json.dumps({"type": kind, "event_id": "e1", **fields}))
        assert isinstance(parsed, cls) and parsed.event_id == "e1"
    assert (
        ev.parse_client_event(json.dumps({"type": "input_audio_buffer.append", "audio": audio})).data()
        == b"\x00\x01" * 10
    )


@pytest.mark.parametrize(
    ("raw", "code", "says"),
    [
        ("{", "invalid_json", "not valid JSON"),
        ("[1]", "invalid_event", "JSON object"),
        ('{"type": "nope"}', "unknown_event", "unknown event type"),
        ('{"type": "conversation.item.truncate", "item_id": "i"}', "invalid_event", "audio_end_ms"),
        ('{"type": "session.update", "session": [1]}', "invalid_event", "session"),
        ('{"type": "conversation.item.create", "item": {"role": "robot"}}', "invalid_event", "item.role"),
        (
            '{"type": "conversation.item.create", "item": {"content": [{"type": "input_text", "text": 5}]}}',
            "invalid_event",
            "text",
        ),
        (
            '{"type": "response.create", "response": {"conversation": "other"}}',
            "invalid_event",
            "conversation",
        ),
        (
            '{"type": "response.create", "response": {"metadata": {"k": "%s"}}}' % ("v" * 513),
            "invalid_event",
            "metadata",
        ),
    ],
)
def test_bad_events_name_the_problem(raw, code, says):
    with pytest.raises(ev.RealtimeEventError) as e:
        ev.parse_client_event(raw)
    assert e.value.code == code and says in str(e.value)


def test_bad_and_oversized_audio_are_refused():
    with pytest.raises(ev.RealtimeEventError, match="base64"):
        ev.parse_client_event('{"type": "input_audio_buffer.append", "audio": "%%%%"}').data()
    with pytest.raises(ev.RealtimeEventError, match="even number"):
        odd = base64.b64encode(b"\x00\x01\x02").decode()
        InputAudio("audio/pcm").decode(
            ev.parse_client_event(json.dumps({"type": "input_audio_buffer.append", "audio": odd})).data()
        )
    with pytest.raises(ev.RealtimeEventError, match="audio"):
        ev.parse_client_event(
            json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (ev.MAX_APPEND_BASE64 + 4)})
        )


@given(
    st.one_of(
        st.text(max_size=200),
        st.binary(max_size=200),
        st.dictionaries(st.text(max_size=8), st.text(max_size=8)).map(json.dumps),
    )
)
def test_any_input_is_an_event_or_an_error(raw):
    try:
        parsed = ev.parse_client_event(raw)
    except ev.RealtimeEventError as e:
        assert e.code and str(e)
    else:
        assert parsed.type in ev.CLIENT_TYPES


def test_session_update_applies_field_by_field():
    """What does not validate keeps its value and is named; the rest applies (OpenAI's
    `session.update` drops nothing a client got right)."""
    current = ev.SessionConfig(instructions="old", max_output_tokens=9)
    given = {
        "instructions": "new",
        "output_modalities": ["smell"],
        "max_output_tokens": "lots",
        "audio": {"output": {"voice": "x"}, "input": {"turn_detection": {"type": "semantic_vad", "eagerness": "fast"}}},
        "omniray": {"seed": 2**63},
    }  # fmt: skip
    config, applied, refused = ev.updated(current, given)
    assert config.instructions == "new" and config.audio.output.voice == "x"
    assert (
        config.output_modalities == ["audio"]
        and config.max_output_tokens == 9
        and config.omniray.seed is None
    )
    assert {loc[0] for loc, _ in refused} == {"output_modalities", "max_output_tokens", "audio", "omniray"}
    assert "output_modalities" not in applied and applied["audio"]["output"] == {"voice": "x"}
    # semantic VAD (its eagerness refused above) is server VAD with eagerness' silence
    semantic = ev.updated(
        current, {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "low"}}}}
    )[0]
    assert semantic.audio.input.turn_detection.silence_ms == 1200


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=12))  # fmt: skip
def test_any_session_update_applies_or_is_refused_field_by_field(given_session):
    if not isinstance(given_session, dict):
        given_session = {"instructions": given_session}
    config, applied, refused = ev.updated(ev.SessionConfig(), given_session)
    assert isinstance(config, ev.SessionConfig) and all(loc for loc, _ in refused)
