"""Per-stream draws in a batch (services/models/qwen3_omni/sampling.py): each sampled row draws what
`torch.multinomial(probs, 1)` draws alone from the same generator state, and leaves the generator
where multinomial leaves it, whatever the other rows are (seeded, unseeded, greedy); unseeded rows
draw from torch's own generator. Property-tested over random scores, seeds and batch shapes."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from services.models.qwen3_omni import sampling


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.one_of(st.none(), st.integers(0, 2**31 - 1), st.just("greedy")), min_size=1, max_size=6),
    vocab=st.sampled_from([16, 257, 2048]),
    data_seed=st.integers(0, 1000),
)
def test_each_row_draws_what_multinomial_draws_alone(rows, vocab, data_seed):
    scores = torch.randn((len(rows), vocab), generator=torch.Generator().manual_seed(data_seed)) * 4
    generators = [torch.Generator().manual_seed(r) if isinstance(r, int) else None for r in rows]
    sample = [r != "greedy" for r in rows]
    torch.manual_seed(data_seed)  # the unseeded rows' draws, in row order
    got = sampling._draw(scores, sample, generators).tolist()
    after = [g.get_state() if g is not None else None for g in generators]

    torch.manual_seed(data_seed)
    probs = torch.softmax(scores, dim=-1)
    for i, r in enumerate(rows):
        if r == "greedy":
            assert got[i] == int(scores[i].argmax())
            continue
        g = torch.Generator().manual_seed(r) if isinstance(r, int) else None
        assert got[i] == int(torch.multinomial(probs[i : i + 1], 1, generator=g)), (i, r)
        if g is not None:
            assert torch.equal(g.get_state(), after[i])


def test_rows_with_other_settings_get_their_own_processors():
    """Greedy and sampled streams, and two temperatures, side by side: each row's code is the one its
    own settings give it alone."""
    logits = torch.randn((4, 64), generator=torch.Generator().manual_seed(0))
    history = torch.tensor([[1, 2], [3, 3], [5, 6], [7, 7]])
    settings_ = [
        sampling.Sampling(do_sample=False),
        sampling.Sampling(temperature=0.5),
        sampling.Sampling(),
        sampling.Sampling(temperature=0.5, repetition_penalty=1.3),
    ]
    seeds = [None, 1, 2, 3]
    gens = [torch.Generator().manual_seed(s) if s is not None else None for s in seeds]
    together = sampling.talker_codes(logits.clone(), settings_, history, (60, 61), gens).tolist()
    for i in range(4):
        g = torch.Generator().manual_seed(seeds[i]) if seeds[i] is not None else None
        alone = sampling.talker_codes(
            logits[i : i + 1].clone(), [settings_[i]], history[i : i + 1], (60, 61), [g]
        )
        assert together[i] == int(alone[0]), i
    assert together[0] not in (60, 61)  # suppressed
