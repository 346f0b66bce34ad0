"""Realtime client events: every known type parses into its class; anything else is an error that
names what is wrong (never an exception the session does not expect)."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.realtime import events as ev


def test_known_events_parse_into_their_classes():
    audio = base64.b64encode(b"\x00\x01" * 10).decode()
    cases = {
        "session.update": ({"session": {"type": "realtime", "instructions": "be brief"}}, ev.SessionUpdate),
        "input_audio_buffer.append": ({"audio": audio}, ev.InputAudioBufferAppend),
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
    }
    assert set(cases) == ev.CLIENT_TYPES
    extension = {"session": {"omniray": {"seed": -(2**63), "speculative_prefill": False}}}
    update = ev.parse_client_event(json.dumps({"type": "session.update", **extension}))
    assert update.session.omniray.seed == -(2**63) and update.session.omniray.speculative_prefill is False
    for kind, (fields, cls) in cases.items():
        parsed = ev.parse_client_event(json.dumps({"type": kind, "event_id": "e1", **fields}))
        assert isinstance(parsed, cls) and parsed.event_id == "e1"
    assert (
        ev.parse_client_event(json.dumps({"type": "input_audio_buffer.append", "audio": audio})).pcm16()
        == b"\x00\x01" * 10
    )


@pytest.mark.parametrize(
    ("raw", "code", "says"),
    [
        ("{", "invalid_json", "not valid JSON"),
        ("[1]", "invalid_event", "JSON object"),
        ('{"type": "nope"}', "unknown_event", "unknown event type"),
        ('{"type": "conversation.item.truncate", "item_id": "i"}', "invalid_event", "audio_end_ms"),
        (
            '{"type": "session.update", "session": {"output_modalities": ["smell"]}}',
            "invalid_event",
            "output_modalities",
        ),
        (
            '{"type": "session.update", "session": {"omniray": {"seed": 9223372036854775808}}}',
            "invalid_event",
            "seed",
        ),
        ('{"type": "session.update", "session": {"omniray": {"seed": "seven"}}}', "invalid_event", "seed"),
    ],
)
def test_bad_events_name_the_problem(raw, code, says):
    with pytest.raises(ev.RealtimeEventError) as e:
        ev.parse_client_event(raw)
    assert e.value.code == code and says in str(e.value)


def test_bad_and_oversized_audio_are_refused():
    with pytest.raises(ev.RealtimeEventError, match="base64"):
        ev.parse_client_event('{"type": "input_audio_buffer.append", "audio": "%%%%"}').pcm16()
    with pytest.raises(ev.RealtimeEventError, match="even number"):
        odd = base64.b64encode(b"\x00\x01\x02").decode()
        ev.parse_client_event(json.dumps({"type": "input_audio_buffer.append", "audio": odd})).pcm16()
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
