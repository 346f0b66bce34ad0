from services.policies.scorers import SCORERS
from services.policies.scorers.base import Candidate, RoutedRequest


def test_fewest_pending_tiles_scores_highest_and_completion_frees():
    s = SCORERS.create("least_pending_tiles", {"half_at": 16})
    a, b = Candidate("a", 0), Candidate("b", 0)
    s.on_routed(RoutedRequest("doc", tiles=200), "a")
    scores = s.score(RoutedRequest("chat", tiles=1), [a, b])
    assert scores["b"] > scores["a"]
    s.on_completed("doc", "a")
    assert s.score(RoutedRequest("chat", tiles=1), [a, b])["a"] == 1.0


def test_replica_reported_tiles_count_too():
    s = SCORERS.create("least_pending_tiles", {})
    busy = Candidate("a", 0, {"pending_tiles": 64})
    assert s.score(RoutedRequest("x"), [busy, Candidate("b", 0)])["a"] < 0.5
