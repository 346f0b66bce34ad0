"""How vLLM's processes wait for each other's messages on a CPU machine.

vLLM's shared-memory queues (engine core → workers, and back) are read by a reader that busy-waits
(`sched_yield`) for `busy_loop_s` (1 s) after each message it reads, then parks on a zmq
notification. A paced engine (the interaction-aware scheduler holding replies ahead of playback)
sends its worker a message every few milliseconds, so that worker never parks: on a two-core
machine it burned 0.6 of a core while its engine paced (docs/planner.md). Parking sooner is not
enough on its own: vLLM's notifications can be lost (a PUB socket with a high-water mark of one and
a conflating SUB), and a reader parked on one waits out its recheck interval (5 s) — measured, a
two-process ping-pong stalled 5.0 s.

So within `busy_loop_s` of its last read a reader here spins only `spin_s` of each wait, then naps:
it waits on the notification at most `nap_ms` at a time and looks at the buffer again, whether or
not one came.
A notification wakes it at once; a lost one costs at most one nap; a held engine's worker sleeps.
After `busy_loop_s` vLLM's own wait (park until notified, rechecking every 5 s) is unchanged, lost
notifications there included. Installed by the general plugin on CPU platforms only: on a GPU node
spare cores make vLLM's spin cheap, and its latency is worth more. Not with vLLM's C spin loop
(`VLLM_USE_SPINLOOP_EXT`), which spins up to 100 ms before each wait and would leave the nap nothing.
"""

from __future__ import annotations

import logging
import os
import time

ENV = "OMNIRAY_VLLM_SHM_NAP_MS"  # 0: vLLM's own wait
NAP_MS = 1
# A message within this long of the wait's start is picked up spinning (an engine stepping: the
# other side answers within a millisecond or two); a later one wakes the reader through its
# notification (or after one nap, where that was lost). Shorter than a held engine's 5 ms rounds.
SPIN_S = 0.002

log = logging.getLogger(__name__)


def nap_ms_from_env() -> int:
    """`OMNIRAY_VLLM_SHM_NAP_MS`, or NAP_MS where unset or not a whole number ≥ 0 (a bad value
    must not stop every engine process from loading its plugins)."""
    raw = os.environ.get(ENV, "")
    try:
        value = int(raw) if raw.strip() else NAP_MS
    except ValueError:
        value = -1
    if value < 0:
        log.warning("%s=%r is not a whole number of milliseconds >= 0: %d used", ENV, raw, NAP_MS)
        return NAP_MS
    return value


def install(nap_ms: int | None = None, spin_s: float = SPIN_S) -> bool:
    """Replace vLLM's reader wait in this process (existing queues included: the method is the
    class's); a nap of 0 (`OMNIRAY_VLLM_SHM_NAP_MS=0`) puts vLLM's own back. Whether the napping
    wait is in place."""
    from vllm.distributed.device_communicators import shm_broadcast
    from vllm.distributed.utils import sched_yield

    nap_ms = nap_ms_from_env() if nap_ms is None else nap_ms
    spin = shm_broadcast.SpinCondition
    vllm_wait = getattr(spin.wait, "vllm_wait", spin.wait)
    if nap_ms <= 0 or shm_broadcast.SPINLOOP_EXT_ENABLED:
        spin.wait = vllm_wait
        return False

    def wait(self, timeout_ms: int | None = None) -> None:
        now = time.monotonic()
        if now - self.last_read > self.busy_loop_s:
            return vllm_wait(self, timeout_ms)  # idle: park until notified, as vLLM does
        if getattr(self, "_waiting_since_read", None) != self.last_read:  # a new wait begins
            self._waiting_since_read, self._wait_began = self.last_read, now
        if now - self._wait_began <= spin_s:
            sched_yield()
            return
        nap = nap_ms if timeout_ms is None else max(0, min(nap_ms, timeout_ms))
        if self.local_notify_socket in dict(self.poller.poll(timeout=nap)):
            self.local_notify_socket.recv(flags=shm_broadcast.zmq.NOBLOCK, copy=False)
        # a cancel stays in its socket: the caller checks `shutting_down` after each wait

    wait.vllm_wait = vllm_wait
    spin.wait = wait
    return True
