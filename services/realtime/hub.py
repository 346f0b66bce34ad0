"""Where realtime sessions are opened and closed, for every transport (WebSocket, gRPC): the key is
checked, the model named, the tenant's session cap (quota service, across gateways), the AIMD
admission (this replica's capacity) and, where the profile has a realtime decode pool, a seat on one
of its replicas asked; the session monitor and the metrics are shared by all sessions of this
gateway replica."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable

from pydantic import ValidationError

from services.common.errors import OmniError
from services.common.redis_config import async_client
from services.common.session_key import SessionKey
from services.extensions.ray.replica_drain import on_drain
from services.playback.board import BoardWriter
from services.playback.monitor import PlaybackMonitor
from services.policies.admission import AimdAdmission
from services.quota.client_secrets import is_client_secret
from services.realtime import events as ev
from services.realtime import server_events as se
from services.realtime.continuity import SessionStore
from services.realtime.pool_seats import PoolSeats
from services.realtime.session import RealtimeSession
from services.realtime.stats import RealtimeStats

log = logging.getLogger(__name__)

SESSION_ID = re.compile(r"sess_[A-Za-z0-9_-]{1,64}")


class Refused(Exception):
    """The session is not opened: the `error` event to send, and why (for the transport's close).
    Both live in `args`, so the exception survives pickling (Ray carries it to Serve's gRPC proxy)."""

    def __init__(self, event: se.Error, reason: str):
        super().__init__(event, reason)  # reason: unauthenticated | not_found | limit | unavailable

    @property
    def event(self) -> se.Error:
        return self.args[0]

    @property
    def reason(self) -> str:
        return self.args[1]

    def __str__(self) -> str:
        return self.event.error.message


class RealtimeHub:
    def __init__(self, pipeline, profile, quota):
        self.pipeline, self.profile, self.quota = pipeline, profile, quota
        self.monitor = PlaybackMonitor()
        self.admission = AimdAdmission(profile.realtime.admission)
        self.seats = PoolSeats.of(profile)
        self.stats = RealtimeStats()
        self._board: asyncio.Task | None = None
        self._drain_watch: asyncio.Task | None = None
        self.draining = False
        self._store: SessionStore | None = None
        self._live: dict[str, RealtimeSession] = {}  # this replica's sessions by tenant/session key

    @property
    def store(self) -> SessionStore | None:
        """Where sessions are saved for a reconnect (None: continuity off)."""
        spec = self.profile.realtime.continuity
        if spec.enabled and self._store is None:
            self._store = SessionStore(async_client(), spec.grace_s)
        return self._store

    def _publish_board(self) -> None:
        """Start publishing the monitor to the session board (engines' scheduler) on first use."""
        if self._board is None:
            writer = BoardWriter(
                self.monitor, async_client(), self.profile.realtime.scheduler.board_interval_s
            )
            self._board = asyncio.create_task(writer.run())

    def _watch_drain(self) -> None:
        """Move this replica's sessions away once Serve begins draining it (first session on)."""
        spec = self.profile.realtime.continuity
        if spec.enabled and self._drain_watch is None:
            self._drain_watch = asyncio.create_task(on_drain(self.drain, spec.drain_check_s))

    async def drain(self) -> None:
        """This replica is going away (scale-down, an update): each session is saved at its next
        turn boundary and its client told to reconnect with its id (`omniray.session.migrate`);
        Serve routes the reconnect to a replica that stays."""
        self.draining = True
        log.info("gateway replica draining: moving %d realtime sessions", len(self._live))
        await asyncio.gather(*(session.migrate() for session in list(self._live.values())))

    async def open(
        self,
        api_key: str | None,
        model: str | None,
        send: Callable[[se.ServerEvent], Awaitable[None]],
        resume: str | None = None,
        settings: dict | None = None,
        *,
        audio_track: bool = False,
    ) -> RealtimeSession:
        """A new session, or with `resume` (a session id) the tenant's saved session of that id.
        `settings`: session settings the client sent with the open (a WebRTC call's form), applied
        before `session.created`. `api_key` may be a client secret
        (services/quota/client_secrets.py): used up here, its own settings applied instead (a caller
        does not send both). A resumed session keeps its saved settings.
        `audio_track`: the transport plays the responses' audio itself (WebRTC): it gets pcm16,
        whatever the session's output format."""
        try:
            if is_client_secret(api_key):
                tenant, settings = await self.quota.redeem_secret(api_key)
            else:
                tenant = await self.quota.authenticate(api_key)
        except OmniError as e:
            if e.status != 401:  # the key could not be checked now (quota store unreachable)
                raise Refused(se.error(e.message, e.code, kind="server_error"), "unavailable") from None
            raise Refused(
                se.error(e.message, e.code or "invalid_api_key", kind="authentication_error"),
                "unauthenticated",
            ) from None
        if settings:
            model = model or settings.get("model")  # names of this deployment's one model
        if model and not self.profile.serves(model):
            raise Refused(se.error(f"model {model!r} is not served here", "model_not_found"), "not_found")
        session_id = se.new_id("sess") if resume is None else self._resumable(resume)
        key = str(SessionKey(tenant.id, session_id))
        await self._admit(tenant, session_id, key)
        self.stats.admitted.inc()
        self.stats.admission_limit.set(self.admission.limit)
        self._publish_board()
        session = None
        try:
            continuity, saved = await self._hold(tenant, session_id, resume is not None)
            if saved is not None and (old := self._live.get(key)) is not None:
                await old.taken_over()  # a live connection of this replica: it ends now
            session = RealtimeSession(
                self.pipeline, self.profile, tenant, session_id, send, self.monitor, self.admission, self.stats,
                continuity, audio_track,
            )  # fmt: skip
            if saved is not None:
                session.restore(*saved)
            self._live[key] = session
            await session.start(resumed=saved is not None, settings=None if saved is not None else settings)
            self._watch_drain()
            if self.draining:  # opened on a replica already draining: it moves on at once
                await session.migrate()
        except BaseException:  # refused, or the client left before session.created: slots go back
            if session is not None:
                await self.close(session)
            else:
                self.admission.release()
                await self.quota.close_session(tenant, session_id)
                if self.seats is not None:
                    await self.seats.give_back(key)
            raise
        self.stats.sessions.set(len(self.monitor))
        return session

    async def _admit(self, tenant, session_id: str, key: str) -> None:
        """The tenant's session cap, this replica's AIMD limit and a seat in the realtime decode
        pool, taken in that order; Refused (each taken one given back) at the first that is full."""
        try:
            await self.quota.open_session(tenant, session_id)
        except OmniError as e:  # the tenant's session cap (counted by the quota), or its store unreachable
            if e.status == 429:
                raise Refused(se.error(e.message, e.code, kind="rate_limit_error"), "limit") from None
            raise Refused(se.error(e.message, e.code, kind="server_error"), "unavailable") from None
        if not self.admission.try_admit():
            why = f"this server is at its realtime session limit ({int(self.admission.limit)})"
        elif self.seats is not None and not await self.seats.take(key):
            self.admission.release()
            why = "every realtime decode replica holds its cap of sessions"
        else:
            return
        self.stats.rejected.inc()
        await self.quota.close_session(tenant, session_id)
        raise Refused(
            se.error(f"{why}; try again later", "session_limit_reached", kind="server_error"), "limit"
        )

    def _resumable(self, session_id: str) -> str:
        if self.store is None:
            raise Refused(
                se.error("sessions cannot be resumed on this server", "session_not_found"), "not_found"
            )
        if not SESSION_ID.fullmatch(session_id):
            raise Refused(se.error("session_id is not a session id", "invalid_session_id"), "not_found")
        return session_id

    async def _hold(self, tenant, session_id: str, resume: bool):
        """This connection's hold on the session's saved record — (store, owner) or None when
        continuity is off or the store is unreachable for a new session (it runs unresumable) — and,
        resuming, the saved (state, clips), taken over in one step."""
        store, key = self.store, SessionKey(tenant.id, session_id)
        if store is None:
            return None, None
        unreachable = Refused(
            se.error(
                "the session store is unreachable; try again",
                "session_store_unavailable",
                kind="server_error",
            ),
            "unavailable",
        )
        if not resume:
            try:
                return (store, await store.claim(key)), None
            except Exception:
                self.stats.saves.inc(tags={"outcome": "failed"})
                return None, None
        try:
            found = await store.resume(key)
            if found is not None:
                ev.SessionConfig.model_validate(found[1].config)
        except ValidationError:  # saved by a version that reads it differently: cannot resume it
            found = None
        except Exception:
            raise unreachable from None
        if found is None:
            self.stats.resumes.inc(tags={"outcome": "not_found"})
            raise Refused(
                se.error(f"no session {session_id!r} to resume (never saved, or its grace period is over)",
                         "session_not_found"),
                "not_found",
            )  # fmt: skip
        owner, state, clips = found
        self.stats.resumes.inc(tags={"outcome": "ok"})
        return (store, owner), (state, clips)

    async def close(self, session: RealtimeSession) -> None:
        key = str(SessionKey(session.tenant.id, session.id))
        if self._live.get(key) is session:
            del self._live[key]
        try:
            await session.close()
        finally:
            self.admission.release()
            if not (session.taken or session.moved):  # the slot is the (coming) new connection's
                await self.quota.close_session(session.tenant, session.id)
                if self.seats is not None:
                    await self.seats.give_back(key)
            elif self.seats is not None and key not in self._live:  # renewed where it went on
                self.seats.moved(key)
        self.stats.sessions.set(len(self.monitor))
        self.stats.admission_limit.set(self.admission.limit)
