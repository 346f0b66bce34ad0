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

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from services.common.session_key import SessionKey

PREFIX = "omniray:realtime:"
SAVE_WAIT_S = 5.0  # at close, how long the last save may still take
log = logging.getLogger(__name__)

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


class SessionSaver:
    """Saves one session at its turn boundaries: one save at a time, a boundary during a save makes
    one more after it; only the clips not saved yet are written. A session resumed elsewhere
    (`Taken`) is told through `taken`; a failed save is counted and the session goes on."""

    def __init__(
        self, store: SessionStore, owner: str, key: SessionKey, stats, taken: Callable[[], Awaitable[None]]
    ):
        self.store, self.owner, self.key, self.stats, self.taken = store, owner, key, stats, taken
        self.saved_clips: set[str] = set()
        self._saving: asyncio.Task | None = None
        self._again = False
        self.stopped = False  # the connection closes: nothing more is saved after the save in flight

    def soon(self, snapshot: Callable[[], tuple[SavedState, list]]) -> None:
        """Save what `snapshot` gives (the state and the conversation's items) when the save in
        flight is done, or now."""
        if self.stopped:
            return
        self._snapshot = snapshot
        if self._saving is not None and not self._saving.done():
            self._again = True
            return
        self._saving = asyncio.create_task(self._save())

    async def _save(self) -> None:
        while True:
            self._again = False
            try:
                state, new_clips, gone = self._state()
                await self.store.save(self.key, self.owner, state, new_clips, gone)
            except Taken:  # resumed by another connection: this one ends
                self.stats.saves.inc(tags={"outcome": "taken"})
                await self.taken()
                return
            except Lapsed:  # no save for grace_s while connected: a new record, every clip again
                with contextlib.suppress(Exception):
                    await self.store.claim(self.key, self.owner)
                    self.saved_clips = set()
                    self._again = True
            except Exception as e:  # Redis away: this turn cannot be resumed; the session goes on
                self.stats.saves.inc(tags={"outcome": "failed"})
                log.warning("realtime session %s: save failed: %s", self.key, e)
            else:
                self.stats.saves.inc(tags={"outcome": "ok"})
                self.saved_clips = (self.saved_clips | new_clips.keys()) - set(gone)
            if not self._again or self.stopped:
                return

    def _state(self) -> tuple[SavedState, dict[str, np.ndarray], list[str]]:
        """The state to save, the clips not saved yet (by field), the saved clips gone since."""
        state, items = self._snapshot()
        saved, new_clips, names = [], {}, set()
        for item in items:
            item_names = [f"clip:{item.id}:{k}" for k in range(len(item.clips))]
            for name, clip in zip(item_names, item.clips, strict=True):
                names.add(name)
                if name not in self.saved_clips:
                    new_clips[name] = clip.samples()
            fields = {f: getattr(item, f) for f in SavedItem.model_fields if f != "clips"}
            saved.append(SavedItem(**fields, clips=item_names))
        state.items = saved
        return state, new_clips, sorted(self.saved_clips - names)

    async def saved(self) -> None:
        """Wait for the save in flight, if any, up to SAVE_WAIT_S (a failed one is counted)."""
        if self._saving is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._saving), SAVE_WAIT_S)
