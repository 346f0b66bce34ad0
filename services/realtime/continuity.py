"""Realtime sessions that outlive their connection: the session's state — settings, the conversation
window's items (a user turn's audio too, so a resumed conversation sends the model the same prompt
and its KV is found, not recomputed), the prompt measurements — is saved to Redis at every turn
boundary, where any gateway replica can load it. A client that reconnects with its session id
within `realtime.continuity.grace_s` of the last save resumes the conversation (docs/realtime.md);
the uncommitted input buffer and a response in flight are not kept.

One Redis hash per session, `omniray:realtime:{tenant}/{session}`: `state` (JSON), one field per
audio clip (`clip:{item}:{k}`: PCM16 at the session rate, written once), and `owner`, the token of
the connection that holds the session. A resume takes the session over (a new owner); saves are
conditional on the owner (a Lua script), so a connection that was taken over cannot overwrite the
conversation. Every call is bounded by the Redis client's timeouts; a failed save is counted and
the session goes on (it just cannot be resumed from that turn).
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from services.common.session_key import SessionKey

PREFIX = "omniray:realtime:"

# KEYS[1] the hash; ARGV: owner, ttl_s, fields to delete count, those fields, then field/value pairs.
_SAVE = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
local n = tonumber(ARGV[3])
for i = 1, n do redis.call('HDEL', KEYS[1], ARGV[3 + i]) end
for i = 4 + n, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""


class SavedItem(BaseModel):
    """An item as saved: `services.realtime.session.Item` without its clips (saved apart)."""

    model_config = ConfigDict(extra="forbid")
    id: str
    role: str
    kind: str = "message"
    text: str = ""
    tokens: int = 0
    generated: str = ""
    spoken: list[list] = []
    audio_out: bool = True
    transcript: str | None = None
    call_id: str = ""
    name: str = ""
    audio_tokens: int | None = None
    clips: list[str] = []  # the hash fields of its clips, in order


class SavedState(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config: dict[str, Any]
    conversation_id: str
    items: list[SavedItem]
    head_tokens: int = 0
    turn_overhead: int = 0
    audio_rate: float = 0.0


def _pcm16(samples: np.ndarray) -> bytes:
    """The exact inverse of AudioClip.from_pcm16 (x / 32768): the same clip loads back bit for bit,
    so the resumed prompt is the same (its encoder features and KV are found)."""
    return np.clip(np.rint(samples * 32768.0), -32768, 32767).astype("<i2").tobytes()


class Taken(Exception):
    """The session was resumed by another connection: this one no longer owns it."""


class SessionStore:
    def __init__(self, redis, grace_s: float):
        self.redis, self.grace_s = redis, grace_s
        self._save = redis.register_script(_SAVE)

    @staticmethod
    def key(session: SessionKey) -> str:
        return PREFIX + str(session)

    async def claim(self, session: SessionKey, fresh: bool) -> str:
        """Own the session's record (a new session's, or take over a saved one); the owner token."""
        owner = secrets.token_hex(16)
        key = self.key(session)
        async with self.redis.pipeline(transaction=True) as pipe:
            if fresh:
                pipe.delete(key)
            pipe.hset(key, "owner", owner)
            pipe.expire(key, int(self.grace_s))
            await pipe.execute()
        return owner

    async def load(self, session: SessionKey) -> tuple[SavedState, dict[str, np.ndarray]] | None:
        """The saved state and its clips (float32 samples by field), or None (never saved, or
        expired)."""
        raw = await self.redis.hgetall(self.key(session))
        state = raw.get(b"state")
        if state is None:
            return None
        saved = SavedState.model_validate_json(state)
        clips = {}
        for item in saved.items:
            for name in item.clips:
                pcm = raw.get(name.encode())
                if pcm is None:
                    return None  # a partial record (should not happen: saves are atomic)
                clips[name] = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
        return saved, clips

    async def save(self, session: SessionKey, owner: str, state: SavedState, new_clips: dict[str, np.ndarray],
                   gone_clips: list[str]) -> None:  # fmt: skip
        """Write the state, the clips not written before, and drop the clips of items gone; raises
        `Taken` when another connection owns the session now."""
        pairs: list[Any] = ["state", state.model_dump_json()]
        for name, samples in new_clips.items():
            pairs += [name, _pcm16(samples)]
        args = [owner, int(self.grace_s), len(gone_clips), *gone_clips, *pairs]
        if not await self._save(keys=[self.key(session)], args=args):
            raise Taken(str(session))

    async def forget(self, session: SessionKey, owner: str) -> None:
        """Drop the record now (the session ended for good), if this connection still owns it."""
        key = self.key(session)
        if await self.redis.hget(key, "owner") == owner.encode():
            await self.redis.delete(key)
