from services.policies.scorers.base import Candidate, RoutedRequest
from services.policies.scorers.queue_length import create


def test_shorter_queue_scores_higher_unknown_counts_as_empty():
    scores = create({"half_at": 4}).score(RoutedRequest("r"), [Candidate("a", 8), Candidate("b", None)])
    assert scores == {"a": 1 / 3, "b": 1.0}
