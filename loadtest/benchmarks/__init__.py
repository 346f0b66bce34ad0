"""Benchmarks (`make bench*`): each measures its baseline in the same run and prints ratios;
figures go to loadtest/results/ (loadtest/results.py) and docs/benchmarks.md."""
