"""A counter series exported at 0 before its first event, so dashboards and alerts see it in a
healthy run. Ray 2.60's public `Counter.inc` refuses 0; `_record` is what `inc` calls (written for
Ray 2.60; tests/contracts/test_ray_metrics.py reads the series back from Ray's endpoint)."""

from __future__ import annotations


def zero(counter, **tags: str) -> None:
    counter._record(0, tags=tags)
