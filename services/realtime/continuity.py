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
# 1: saved; 0: another connection owns it; 2: the record is gone (it lapsed).
_SAVE = """
local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner then return 2 end
if owner ~= ARGV[1] then return 0 end
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


# KEYS[1] the hash; ARGV: the new owner, ttl_s. The saved record, taken over in the same step (so
# nothing the old owner saves after it was read can be lost), or nil.
_RESUME = """
if redis.call('HEXISTS', KEYS[1], 'state') == 0 then return false end
redis.call('HSET', KEYS[1], 'owner', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return redis.call('HGETALL', KEYS[1])
"""


class Taken(Exception):
    """The session was resumed by another connection: this one no longer owns it."""


class Lapsed(Exception):
    """The record expired while the connection lived (no save for `grace_s`): claim it again and
    save everything."""


class SessionStore:
    def __init__(self, redis, grace_s: float):
        self.redis, self.grace_s = redis, grace_s
        self._save = redis.register_script(_SAVE)
        self._resume = redis.register_script(_RESUME)

    @staticmethod
    def key(session: SessionKey) -> str:
        return PREFIX + str(session)

    async def claim(self, session: SessionKey, owner: str | None = None) -> str:
        """A new record for the session, owned by `owner` (a new token by default); the owner."""
        owner = owner or secrets.token_hex(16)
        key = self.key(session)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, "owner", owner)
            pipe.expire(key, int(self.grace_s))
            await pipe.execute()
        return owner

    async def resume(self, session: SessionKey) -> tuple[str, SavedState, dict[str, np.ndarray]] | None:
        """Take the saved session over: (the new owner token, its state, its clips as float32
        samples by field), or None (never saved, or expired)."""
        owner = secrets.token_hex(16)
        flat = await self._resume(keys=[self.key(session)], args=[owner, int(self.grace_s)])
        if not flat:
            return None
        raw = dict(zip(flat[::2], flat[1::2], strict=True))
        saved = SavedState.model_validate_json(raw[b"state"])
        clips = {}
        for item in saved.items:
            for name in item.clips:
                pcm = raw.get(name.encode())
                if pcm is None:
                    return None  # a partial record (should not happen: saves are atomic)
                clips[name] = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
        return owner, saved, clips

    async def save(self, session: SessionKey, owner: str, state: SavedState, new_clips: dict[str, np.ndarray],
                   gone_clips: list[str]) -> None:  # fmt: skip
        """Write the state, the clips not written before, and drop the clips of items gone; raises
        `Taken` when another connection owns the session now, `Lapsed` when the record expired."""
        pairs: list[Any] = ["state", state.model_dump_json()]
        for name, samples in new_clips.items():
            pairs += [name, _pcm16(samples)]
        args = [owner, int(self.grace_s), len(gone_clips), *gone_clips, *pairs]
        done = await self._save(keys=[self.key(session)], args=args)
        if done == 0:
            raise Taken(str(session))
        if done == 2:
            raise Lapsed(str(session))
