import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.policies.scorers import ScorerPipeline
from services.policies.scorers.base import Candidate, RoutedRequest


@given(st.lists(st.integers(0, 50), min_size=1, max_size=8, unique=False))
def test_rank_is_a_permutation_of_the_candidates(queues):
    p = ScorerPipeline.from_config([{"name": "queue_length"}, {"name": "least_pending_tiles", "weight": 2}])
    cands = [Candidate(f"r{i}", q) for i, q in enumerate(queues)]
    ranked = p.rank(RoutedRequest("x"), cands)
    assert sorted(ranked) == sorted(c.replica_id for c in cands)
    assert queues[int(ranked[0][1:])] == min(queues)


def test_weights_combine_signals():
    p = ScorerPipeline.from_config(
        [{"name": "session_affinity", "weight": 10}, {"name": "least_pending_tiles", "weight": 1}]
    )
    p.on_routed(RoutedRequest("1", session_id="s", tiles=100), "a")
    cands = [Candidate("a", 0), Candidate("b", 0)]
    assert p.rank(RoutedRequest("2", session_id="s"), cands)[0] == "a"  # affinity outweighs load
    assert p.rank(RoutedRequest("3"), cands)[0] == "b"  # no session: least pending tiles


def test_unknown_scorer_or_bad_params_fail_at_load():
    with pytest.raises(ValueError, match="unknown scorer 'nope'"):
        ScorerPipeline.from_config([{"name": "nope"}])
    with pytest.raises(ValueError, match="half_at"):
        ScorerPipeline.from_config([{"name": "queue_length", "params": {"half_at": -1}}])
