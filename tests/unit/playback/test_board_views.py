"""Board views as readers get them (services/playback/board.py): a view whose course did not change
keeps its object, what changed is logged per poll, stale views are dropped."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

from services.playback.board import STALE_S, BoardView, decode

NOW = 1000.0


def view(played=0.0, buffered=4000.0, at=NOW, **kw) -> BoardView:
    fields = dict(session_id="s", played_ms=played, age_s=0.0, ms_per_token=None, buffered_ms=buffered,
                  playing=buffered > 0, speaking=False, responding=True, first_audio=True, barge_ins=0,
                  responses=1, reply_gap_ms=None, at=at)  # fmt: skip
    return BoardView(**{**fields, **kw})


def raw(**views: BoardView) -> dict:
    return {sid: json.dumps(asdict(v)) for sid, v in views.items()}


def test_the_same_course_later_is_not_news():
    a = view()
    assert a.same_course(view(played=500, buffered=3500, at=NOW + 0.5))  # played in real time
    assert not a.same_course(view(played=500, buffered=5500, at=NOW + 0.5))  # a chunk arrived
    assert a.refilled(view(played=500, buffered=5500, at=NOW + 0.5))  # ... which is only more audio
    assert not a.refilled(view(played=0, buffered=0, at=NOW + 0.5, barge_ins=1))  # a barge-in
    assert not a.same_course(replace(a, first_audio=False))


def test_decode_keeps_unchanged_views_and_logs_what_changed():
    first = decode(raw(a=view(), b=view()), None, NOW)
    assert first.changes_since(0) == ({"a", "b"}, set())
    second = decode(raw(a=view(played=100, buffered=3900, at=NOW + 0.1), c=view()), first, NOW + 0.1)
    assert second["a"] is first["a"]  # same course: same object
    assert second.changes_since(first.epoch) == ({"b", "c"}, set())  # b left, c arrived
    third = decode(raw(a=view(played=200, buffered=9000, at=NOW + 0.2), c=view()), second, NOW + 0.2)
    assert third["a"] is not first["a"] and third["c"] is second["c"]
    assert third.changes_since(second.epoch) == ({"a"}, {"a"})  # a chunk reached a's client
    assert third.changes_since(first.epoch) == ({"a", "b", "c"}, {"a"})  # a reader that missed a poll
    fourth = decode(
        raw(a=view(played=300, buffered=0, at=NOW + 0.3, barge_ins=1), c=view()), third, NOW + 0.3
    )
    assert fourth.changes_since(second.epoch) == ({"a"}, set())  # a refill then a barge-in: a change
    assert fourth.changes_since(-100) is None  # further back than the log: compare everything


def test_stale_views_are_dropped():
    views = decode(raw(a=view(at=NOW - STALE_S - 1), b=view()), None, NOW)
    assert set(views) == {"b"}
