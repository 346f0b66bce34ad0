from services.policies.scorers import SCORERS
from services.policies.scorers.base import Candidate, RoutedRequest


def test_prefers_the_replica_of_the_previous_turn_until_it_dies():
    s = SCORERS.create("session_affinity", {"max_sessions": 2})
    cands = [Candidate("a", 0), Candidate("b", 0)]
    assert s.score(RoutedRequest("1", session_id="t1/s"), cands) == {"a": 0.0, "b": 0.0}
    s.on_routed(RoutedRequest("1", session_id="t1/s"), "b")
    assert s.score(RoutedRequest("2", session_id="t1/s"), cands) == {"a": 0.0, "b": 1.0}
    assert s.score(RoutedRequest("3", session_id="t2/s"), cands)["b"] == 0.0  # other tenant's key
    s.forget_replica("b")
    assert s.score(RoutedRequest("4", session_id="t1/s"), cands)["b"] == 0.0


def test_bounded():
    s = SCORERS.create("session_affinity", {"max_sessions": 2})
    for i in range(5):
        s.on_routed(RoutedRequest(str(i), session_id=f"s{i}"), "a")
    assert len(s._owner) == 2
