"""How vLLM's processes wait for each other's messages on a CPU machine.

vLLM's shared-memory queues (engine core → workers, and back) are read by a reader that busy-waits
(`sched_yield`) for `busy_loop_s` (1 s) after each message it reads, then parks on a zmq
notification. A paced engine (the interaction-aware scheduler holding replies ahead of playback)
sends its worker a message every few milliseconds, so that worker never parks: on a two-core
machine it burned 0.6 of a core while its engine paced (docs/planner.md). Parking sooner is not
enough on its own: vLLM's notifications can be lost (a PUB socket with a high-water mark of one and
a conflating SUB), and a reader parked on one waits out its recheck interval (5 s) — measured, a
two-process ping-pong stalled 5.0 s.

So within `busy_loop_s` of its last read a reader here spins only `spin_s`, then naps: it waits on
the notification at most `nap_ms` at a time and looks at the buffer again, whether or not one came.
A lost notification costs at most one nap; a held engine's worker sleeps. After `busy_loop_s` vLLM's
own wait (park until notified) is unchanged. Installed by the general plugin on CPU platforms only:
on a GPU node spare cores make vLLM's spin cheap, and its latency is worth more.
"""

from __future__ import annotations

import os
import time

ENV = "OMNIRAY_VLLM_SHM_NAP_MS"  # 0: vLLM's own wait
NAP_MS = 1
SPIN_S = 0.0002  # back-to-back steps' messages are read without a nap


def install(nap_ms: int | None = None, spin_s: float = SPIN_S) -> bool:
    """Replace vLLM's reader wait in this process (existing queues included: the method is the
    class's). Whether it did: not with a nap of 0 (env `OMNIRAY_VLLM_SHM_NAP_MS=0`)."""
    from vllm.distributed.device_communicators import shm_broadcast
    from vllm.distributed.utils import sched_yield

    nap_ms = int(os.environ.get(ENV, NAP_MS)) if nap_ms is None else nap_ms
    spin = shm_broadcast.SpinCondition
    if nap_ms <= 0:
        return False
    vllm_wait = getattr(spin.wait, "vllm_wait", spin.wait)

    def wait(self, timeout_ms: int | None = None) -> None:
        since = time.monotonic() - self.last_read
        if since > self.busy_loop_s:
            return vllm_wait(self, timeout_ms)  # idle: park until notified, as vLLM does
        if since <= spin_s:
            sched_yield()
            return
        nap = nap_ms if timeout_ms is None else max(0, min(nap_ms, timeout_ms))
        if self.local_notify_socket in dict(self.poller.poll(timeout=nap)):
            self.local_notify_socket.recv(flags=shm_broadcast.zmq.NOBLOCK, copy=False)
        # a cancel stays in its socket: the caller checks `shutting_down` after each wait

    wait.vllm_wait = vllm_wait
    spin.wait = wait
    return True
