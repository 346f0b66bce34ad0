"""How much of a realtime conversation the thinker sees (docs/realtime.md, "Conversation window").

Every response sends the whole conversation again, so a long session would reach the engine's
context length, the request's media-item or message limit, and hold all its audio forever. Before
each request the oldest turns (a user turn and the replies to it) are dropped until the rest fits.
Dropping changes the prompt's prefix, so the next request misses the prefix and KV caches: like
OpenAI's `retention_ratio` truncation, once a limit is crossed the window shrinks to a share of
every limit, so that the following turns fit without another drop and hit the cache again.

Pure: no I/O, no Ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TurnCost:
    """What one turn adds to a request."""

    clips: int  # media items (audio clips) of its messages
    messages: int  # chat messages (the user's and each reply with text)
    tokens: int  # prompt tokens (measured or estimated)


@dataclass(frozen=True)
class HistoryLimits:
    """What the turns of one request may add together (instructions already taken off)."""

    turns: int
    clips: int
    messages: int
    tokens: int
    retention: float  # once over a limit, keep at most this share of each (0 < retention <= 1)


def turns_to_drop(turns: Sequence[TurnCost], limits: HistoryLimits) -> int:
    """How many of the oldest `turns` to drop: none if all fit `limits`; else the fewest that bring
    the rest within `limits.retention` of every limit. The newest turn is always kept (alone it
    may still be over a limit: the request then fails on its own, as a client's would)."""
    clips = sum(t.clips for t in turns)
    messages = sum(t.messages for t in turns)
    tokens = sum(t.tokens for t in turns)

    def fits(kept: int, share: float) -> bool:
        return (
            kept <= limits.turns * share
            and clips <= limits.clips * share
            and messages <= limits.messages * share
            and tokens <= limits.tokens * share
        )

    if fits(len(turns), 1.0):
        return 0
    dropped = 0
    while dropped < len(turns) - 1 and (dropped == 0 or not fits(len(turns) - dropped, limits.retention)):
        t = turns[dropped]
        clips, messages, tokens = clips - t.clips, messages - t.messages, tokens - t.tokens
        dropped += 1
    return dropped
