"""Contract: the napping reader wait (services/extensions/vllm/shm_wait.py) on vLLM's real
shared-memory `MessageQueue`s between two processes: within vLLM's busy loop a reader waiting
between messages sleeps instead of spinning, no message is late by more than a nap (an earlier
spin-then-park variant lost a notification now and then and sat out vLLM's 5 s recheck), and its
timeouts and shutdown still end a wait."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import random
import threading
import time

import pytest

from services.extensions.vllm import shm_wait

ROUNDS = 3000


def _echo(to_me, to_you, nap_ms: int) -> None:
    """The other process: each message read is sent straight back."""
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    shm_wait.install(nap_ms)
    inbox = MessageQueue.create_from_handle(to_me, 0)
    outbox = MessageQueue(1, 1)
    inbox.wait_until_ready()
    assert inbox.dequeue() == "hello"
    to_you.send(outbox.export_handle())  # a MessageQueue goes one way: the reply's is another
    outbox.wait_until_ready()
    while (msg := inbox.dequeue()) is not None:
        outbox.enqueue(msg)


@pytest.fixture
def pair():
    """(send, receive) queues of this process, an echo process on the far side; vLLM's own wait
    back afterwards (the patch is the class's, process-wide)."""
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    shm_wait.install(shm_wait.NAP_MS)
    ctx = mp.get_context("spawn")
    outbox = MessageQueue(1, 1)
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_echo, args=(outbox.export_handle(), there, shm_wait.NAP_MS), daemon=True)
    proc.start()
    outbox.wait_until_ready()
    outbox.enqueue("hello")
    assert here.poll(120), "the echo process did not come up"
    inbox = MessageQueue.create_from_handle(here.recv(), 0)
    inbox.wait_until_ready()
    yield outbox, inbox
    with contextlib.suppress(TimeoutError):
        outbox.enqueue(None, timeout=5)
    proc.join(10)
    if proc.is_alive():
        proc.kill()
    shm_wait.install(0)


def test_no_message_waits_on_a_lost_notification(pair):
    """Paced steps' rhythm (pauses of 0–3 ms, longer than the spin): each round trip is quick. The
    earlier 0.5 ms spin-then-park variant stalled 5.0 s once in such thousands (docs/planner.md), and
    with the nap unbounded this test hung."""
    outbox, inbox = pair
    rng, slowest = random.Random(0), 0.0
    for i in range(ROUNDS):
        time.sleep(rng.uniform(0, 0.003))
        sent = time.monotonic()
        outbox.enqueue(i)
        assert inbox.dequeue(timeout=2) == i  # a lost wake-up: TimeoutError
        slowest = max(slowest, time.monotonic() - sent)
    assert slowest < 0.5, f"a round trip took {slowest:.3f} s"


def test_a_reader_between_messages_sleeps(pair):
    """Within vLLM's 1 s busy loop, a reader waiting 0.5 s for its next message spends little CPU
    (vLLM's own wait spins through it): this process's CPU while it waits for the echo of a message
    a timer sends 0.5 s on."""
    outbox, inbox = pair
    outbox.enqueue("warm")
    assert inbox.dequeue(timeout=10) == "warm"
    cpu, started = time.process_time(), time.monotonic()
    threading.Timer(0.5, outbox.enqueue, args=("after",)).start()
    assert inbox.dequeue(timeout=10) == "after"
    waited, spent = time.monotonic() - started, time.process_time() - cpu
    assert waited >= 0.45
    assert spent < 0.2 * waited, f"{spent:.3f} s of CPU in a {waited:.3f} s wait"


def test_a_timeout_ends_a_napping_wait(pair):
    outbox, inbox = pair
    outbox.enqueue("warm")
    assert inbox.dequeue(timeout=10) == "warm"  # within the busy loop from here
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        inbox.dequeue(timeout=0.05)
    assert time.monotonic() - started < 0.5


def test_a_shutdown_ends_a_napping_wait(pair):
    outbox, inbox = pair
    outbox.enqueue("warm")
    assert inbox.dequeue(timeout=10) == "warm"
    started = time.monotonic()
    threading.Timer(0.05, inbox.shutdown).start()
    with pytest.raises(RuntimeError, match="cancelled"):
        inbox.dequeue(timeout=10)
    assert time.monotonic() - started < 0.5


def test_installed_twice_it_wraps_vllms_wait_once_and_a_nap_of_zero_puts_it_back():
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    original = getattr(SpinCondition.wait, "vllm_wait", SpinCondition.wait)
    assert shm_wait.install(1) and shm_wait.install(1)
    assert SpinCondition.wait.vllm_wait is original
    assert not shm_wait.install(0)
    assert SpinCondition.wait is original


def test_a_bad_nap_setting_falls_back_to_the_default(monkeypatch):
    for raw, expected in (
        ("", shm_wait.NAP_MS),
        ("0", 0),
        ("5", 5),
        ("0.5", shm_wait.NAP_MS),
        ("-1", shm_wait.NAP_MS),
    ):
        monkeypatch.setenv(shm_wait.ENV, raw)
        assert shm_wait.nap_ms_from_env() == expected
