"""Where realtime sessions are opened and closed, for every transport (WebSocket, gRPC): the key is
checked, the model named, the tenant's session cap (quota service, across gateways) and the AIMD
admission (this replica's capacity) asked; the session monitor and the metrics are shared by all
sessions of this gateway replica."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from services.common.errors import OmniError
from services.common.redis_config import async_client
from services.playback.board import BoardWriter
from services.playback.monitor import PlaybackMonitor
from services.policies.admission import AimdAdmission
from services.realtime import server_events as se
from services.realtime.session import RealtimeSession
from services.realtime.stats import RealtimeStats


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
        self.stats = RealtimeStats()
        self._board: asyncio.Task | None = None

    def _publish_board(self) -> None:
        """Start publishing the monitor to the session board (engines' scheduler) on first use."""
        if self._board is None:
            writer = BoardWriter(
                self.monitor, async_client(), self.profile.realtime.scheduler.board_interval_s
            )
            self._board = asyncio.create_task(writer.run())

    async def open(
        self, api_key: str | None, model: str | None, send: Callable[[se.ServerEvent], Awaitable[None]]
    ) -> RealtimeSession:
        try:
            tenant = await self.quota.authenticate(api_key)
        except OmniError as e:
            if e.status != 401:  # the key could not be checked now (quota store unreachable)
                raise Refused(se.error(e.message, e.code, kind="server_error"), "unavailable") from None
            raise Refused(
                se.error(e.message, e.code or "invalid_api_key", kind="authentication_error"),
                "unauthenticated",
            ) from None
        if model and not self.profile.serves(model):
            raise Refused(se.error(f"model {model!r} is not served here", "model_not_found"), "not_found")
        session_id = se.new_id("sess")
        try:
            await self.quota.open_session(tenant, session_id)
        except OmniError as e:  # the tenant's session cap (counted by the quota), or its store unreachable
            if e.status == 429:
                raise Refused(se.error(e.message, e.code, kind="rate_limit_error"), "limit") from None
            raise Refused(se.error(e.message, e.code, kind="server_error"), "unavailable") from None
        if not self.admission.try_admit():
            self.stats.rejected.inc()
            await self.quota.close_session(tenant, session_id)
            raise Refused(
                se.error(
                    f"this server is at its realtime session limit ({int(self.admission.limit)}); try again later",
                    "session_limit_reached",
                    kind="server_error",
                ),
                "limit",
            )
        self.stats.admitted.inc()
        self.stats.admission_limit.set(self.admission.limit)
        self._publish_board()
        session = RealtimeSession(
            self.pipeline, self.profile, tenant, session_id, send, self.monitor, self.admission, self.stats
        )
        try:
            await session.start()
        except BaseException:  # e.g. the client left before session.created: its slots go back
            await self.close(session)
            raise
        self.stats.sessions.set(len(self.monitor))
        return session

    async def close(self, session: RealtimeSession) -> None:
        try:
            await session.close()
        finally:
            self.admission.release()
            await self.quota.close_session(session.tenant, session.id)
        self.stats.sessions.set(len(self.monitor))
        self.stats.admission_limit.set(self.admission.limit)
