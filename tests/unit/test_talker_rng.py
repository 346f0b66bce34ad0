"""A seeded Qwen3-Omni talker stream draws from its own random state (services/models/qwen3_omni/
talker.py: `_Rng`), swapped into torch's generators for each of its steps. Seeding another stream
goes through those same generators, so it must wait for a step in progress."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from services.models.qwen3_omni.talker import TalkerStream, _Rng

CPU = torch.device("cpu")


def test_seeding_a_stream_waits_for_a_seeded_stream_stepping(monkeypatch):
    expected = _Rng(1, CPU)
    with TalkerStream._step(SimpleNamespace(_rng=expected)):
        want = torch.rand(4)

    stepping = SimpleNamespace(_rng=_Rng(1, CPU))
    seeded, drew = threading.Event(), threading.Event()
    real_seed = torch.manual_seed

    def seed_then_wait(seed):  # the other stream's seeding pauses with its seed in torch's generators
        generator = real_seed(seed)
        seeded.set()
        drew.wait(5)
        return generator

    monkeypatch.setattr(torch, "manual_seed", seed_then_wait)
    other = threading.Thread(target=_Rng, args=(2, CPU))
    with TalkerStream._step(stepping):
        got = [torch.rand(2)]
        other.start()
        # Unsynchronised, the other stream's seed is in the generators now and this step draws from
        # it (and the seeding's restore rolls the draws back); synchronised, it waits for this step.
        seeded.wait(0.5)
        got.append(torch.rand(2))
        drew.set()
    other.join(10)
    assert not other.is_alive()
    assert torch.equal(torch.cat(got), want)


@pytest.mark.parametrize("seed", [0, 7])
def test_a_seeded_stream_continues_its_draws_across_steps(seed):
    with torch.random.fork_rng():  # the test's own seeding leaves torch's state as it was
        one = SimpleNamespace(_rng=_Rng(seed, CPU))
        torch.manual_seed(seed)
        want = torch.rand(6)
        torch.manual_seed(123)  # torch's own state, which the stream's steps leave as they found it
        own = torch.get_rng_state()
        got = []
        for _ in range(3):
            with TalkerStream._step(one):
                got.append(torch.rand(2))
        assert torch.equal(torch.cat(got), want)
        assert torch.equal(torch.get_rng_state(), own)
