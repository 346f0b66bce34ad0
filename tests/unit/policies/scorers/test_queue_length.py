from services.policies.scorers import SCORERS
from services.policies.scorers.base import Candidate, RoutedRequest


def test_shorter_queue_scores_higher_unknown_counts_as_empty():
    scores = SCORERS.create("queue_length", {"half_at": 4}).score(
        RoutedRequest("r"), [Candidate("a", 8), Candidate("b", None)]
    )
    assert scores == {"a": 1 / 3, "b": 1.0}
