"""The load test's summary and plots, from small Locust CSVs written here in Locust's format."""

from __future__ import annotations

import csv
import json
import math

from loadtest.locustfiles import locust_report

PCTS = ["50%", "66%", "75%", "80%", "90%", "95%", "98%", "99%", "99.9%", "99.99%", "100%"]
STATS = ["Type", "Name", "Request Count", "Failure Count", "Median Response Time", "Average Response Time",
         "Min Response Time", "Max Response Time", "Average Content Size", "Requests/s", "Failures/s", *PCTS]  # fmt: skip
HISTORY = ["Timestamp", "User Count", "Type", "Name", "Requests/s", "Failures/s", *PCTS, "Total Request Count",
           "Total Failure Count", "Total Median Response Time", "Total Average Response Time",
           "Total Min Response Time", "Total Max Response Time", "Total Average Content Size"]  # fmt: skip


def _write(path, header, rows):
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def _stats_row(kind, name, count, fails, p50, p90, p99, rps):
    pct = {"50%": p50, "90%": p90, "99%": p99}
    return [kind, name, count, fails, p50, p50, 1, p99, 10, rps, 0, *(pct.get(p, p99) for p in PCTS)]


def _history_row(t, users, kind, name, rps, fps, p50, p90):
    pct = {"50%": p50, "90%": p90, "99%": p90}
    return [t, users, kind, name, rps, fps, *(pct.get(p, "N/A") for p in PCTS), 0, 0, 0, 0, 0, 0, 0]


def _run(tmp_path, failures=()):
    prefix = tmp_path / "locust"
    _write(tmp_path / "locust_stats.csv", STATS, [
        _stats_row("REST", "chat.text", 40, 0, 900, 1500, 2000, 0.5),
        _stats_row("TTFT", "chat.text", 40, 0, 200, 400, 500, 0.5),
        _stats_row("gRPC", "Omni/Chat", 20, len(failures), 800, 1200, 1300, 0.25),
        _stats_row("WS", "realtime.turn", 10, 0, 3000, 4000, 4100, 0.125),
        _stats_row("", "Aggregated", 110, len(failures), 800, 2000, 4000, 1.375),
    ])  # fmt: skip
    _write(tmp_path / "locust_failures.csv", ["Method", "Name", "Error", "Occurrences"],
           [["gRPC", "Omni/Chat", f"RuntimeError('{m}')", 1] for m in failures])  # fmt: skip
    _write(tmp_path / "locust_stats_history.csv", HISTORY, [
        _history_row(1000, 2, "", "Aggregated", 0, 0, "N/A", "N/A"),
        _history_row(1001, 4, "REST", "chat.text", 1.0, 0, 900, 1500),
        _history_row(1001, 4, "", "Aggregated", 1.0, 0, 900, 1500),
        _history_row(1002, 4, "REST", "chat.text", 1.5, 0, 950, 1600),
        _history_row(1002, 4, "gRPC", "Omni/Chat", 0.5, 0.5, 800, 1200),
        _history_row(1002, 4, "TTFT", "chat.text", 1.5, 0, 200, 400),
        _history_row(1002, 4, "", "Aggregated", 3.5, 0.5, 800, 1500),
    ])  # fmt: skip
    return prefix


def test_summary_counts_requests_not_first_output_rows(tmp_path):
    summary = locust_report.summarize(_run(tmp_path), {"profile": "tiny"})
    assert summary["profile"] == "tiny"
    assert summary["requests"] == 70  # REST + gRPC + WS; TTFT and Aggregated are not requests
    assert summary["failures"] == 0 and summary["failure_messages"] == []
    assert math.isclose(summary["rps"], 0.875)
    rows = {(r["type"], r["name"]): r for r in summary["rows"]}
    assert ("", "Aggregated") not in rows
    assert rows[("TTFT", "chat.text")]["p90_ms"] == 400
    assert rows[("WS", "realtime.turn")]["p50_ms"] == 3000


def test_failures_are_counted_and_named(tmp_path):
    summary = locust_report.summarize(_run(tmp_path, failures=["UNAVAILABLE", "DEADLINE_EXCEEDED"]))
    assert summary["failures"] == 2
    md = locust_report.markdown(summary)
    assert "failures 2" in md and "UNAVAILABLE" in md and "DEADLINE_EXCEEDED" in md


def test_history_is_per_entry_from_the_first_timestamp(tmp_path):
    series = locust_report.history(_run(tmp_path))
    text = series[("REST", "chat.text")]
    assert text["t"] == [1, 2] and text["rps"] == [1.0, 1.5] and text["p90"] == [1500, 1600]
    assert math.isnan(series[("", "Aggregated")]["p50"][0])  # Locust's N/A
    assert series[("", "Aggregated")]["users"] == [2, 4, 4]


def test_write_leaves_summary_markdown_and_a_png(tmp_path):
    locust_report.write(_run(tmp_path), {"title": "synthetic"})
    assert json.loads((tmp_path / "summary.json").read_text())["requests"] == 70
    assert "| REST | chat.text | 40 | 0 | 900 | 1500 | 2000 | 0.50 |" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "locust.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
