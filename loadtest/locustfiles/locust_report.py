"""Summary and plots of a Locust run from its CSVs (`--csv PREFIX --csv-full-history`).

Rows of type REST / gRPC / WS are requests (timed to the end of the stream); rows of type TTFT /
TTFP are time to first token / first audio of those requests (loadtest/locustfiles/locustfile.py), so they are
left out of the request totals. Writes summary.json, summary.md and locust.png (latency percentiles
and throughput over time, from `PREFIX_stats_history.csv`).

    python -m loadtest.locustfiles.locust_report loadtest/results/<time>/locust
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

from loadtest import results

REQUEST_TYPES = ("REST", "gRPC", "WS", "WebRTC")
FIRST_OUTPUT_TYPES = ("TTFT", "TTFP")


def _num(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan  # Locust writes N/A where a window had no requests


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def summarize(prefix: Path, meta: dict | None = None) -> dict:
    """Per (type, name): count, failures, p50/p90/p99 and mean ms, RPS; totals over requests."""
    rows = []
    for r in _rows(Path(f"{prefix}_stats.csv")):
        if r["Name"] == "Aggregated":
            continue
        rows.append({
            "type": r["Type"],
            "name": r["Name"],
            "requests": int(r["Request Count"]),
            "failures": int(r["Failure Count"]),
            "p50_ms": _num(r["50%"]),
            "p90_ms": _num(r["90%"]),
            "p99_ms": _num(r["99%"]),
            "mean_ms": _num(r["Average Response Time"]),
            "rps": _num(r["Requests/s"]),
        })  # fmt: skip
    requests = [r for r in rows if r["type"] in REQUEST_TYPES]
    failures = [{"type": r["Method"], "name": r["Name"], "error": r["Error"], "count": int(r["Occurrences"])}
                for r in _rows(Path(f"{prefix}_failures.csv"))]  # fmt: skip
    return {
        **(meta or {}),
        "requests": sum(r["requests"] for r in requests),
        "failures": sum(r["failures"] for r in requests),
        "rps": sum(r["rps"] for r in requests),
        "rows": rows,
        "failure_messages": failures,
    }


def markdown(summary: dict) -> str:
    def ms(x: float) -> str:
        return "-" if math.isnan(x) else f"{x:.0f}"

    lines = [
        f"requests {summary['requests']}, failures {summary['failures']}, {summary['rps']:.2f} req/s",
        "",
        "| type | name | requests | failures | p50 ms | p90 ms | p99 ms | req/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(summary["rows"], key=lambda r: (r["type"] in FIRST_OUTPUT_TYPES, r["name"], r["type"])):
        lines.append(
            f"| {r['type']} | {r['name']} | {r['requests']} | {r['failures']} | {ms(r['p50_ms'])} "
            f"| {ms(r['p90_ms'])} | {ms(r['p99_ms'])} | {r['rps']:.2f} |"
        )
    for f in summary["failure_messages"]:
        lines.append(f"\nfailure: {f['count']} x {f['type']} {f['name']}: {f['error']}")
    return "\n".join(lines) + "\n"


def history(prefix: Path) -> dict[tuple[str, str], dict[str, list[float]]]:
    """Per (type, name), incl. ('', 'Aggregated'): time since start (s), users, RPS, failures/s and
    the current-window p50/p90/p99 (ms), one point per Locust stats interval."""
    out: dict[tuple[str, str], dict[str, list[float]]] = {}
    rows = _rows(Path(f"{prefix}_stats_history.csv"))
    t0 = min((int(r["Timestamp"]) for r in rows), default=0)
    for r in rows:
        series = out.setdefault(
            (r["Type"], r["Name"]), {k: [] for k in ("t", "users", "rps", "fps", "p50", "p90", "p99")}
        )
        series["t"].append(int(r["Timestamp"]) - t0)
        series["users"].append(_num(r["User Count"]))
        series["rps"].append(_num(r["Requests/s"]))
        series["fps"].append(_num(r["Failures/s"]))
        for p in ("50", "90", "99"):
            series[f"p{p}"].append(_num(r[f"{p}%"]))
    return out


def plot(prefix: Path, png: Path, title: str = "") -> None:
    """Three panels over time: request latency p50/p90 per request name, TTFT/TTFP p50/p90, and
    throughput per request name with failures and the user count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = history(prefix)
    fig, (lat, first, rps) = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    names = sorted({name for kind, name in series if kind in REQUEST_TYPES})
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color = {name: palette[i % len(palette)] for i, name in enumerate(names)}
    for (kind, name), s in sorted(series.items()):
        if kind not in REQUEST_TYPES + FIRST_OUTPUT_TYPES:
            continue
        ax = lat if kind in REQUEST_TYPES else first
        label = name if kind in REQUEST_TYPES else f"{kind} {name}"
        style = {"color": color[name]} if kind != "TTFP" else {"color": color[name], "marker": "."}
        ax.plot(s["t"], [x / 1000 for x in s["p50"]], label=label, **style)
        ax.plot(s["t"], [x / 1000 for x in s["p90"]], linestyle="--", alpha=0.6, **style)
        if kind in REQUEST_TYPES:
            rps.plot(s["t"], s["rps"], label=name, **style)
    total = series.get(("", "Aggregated"))
    if total:
        # Per-name series start at their first request: sum them per timestamp.
        per_t = dict.fromkeys(total["t"], 0.0)
        for (kind, _), s in series.items():
            if kind in REQUEST_TYPES:
                for t, x in zip(s["t"], s["rps"], strict=True):
                    per_t[t] += 0.0 if math.isnan(x) else x
        rps.plot(list(per_t), list(per_t.values()), color="black", linewidth=2, label="all requests")
        rps.plot(total["t"], total["fps"], color="red", linewidth=2, label="failures/s")
        users = rps.twinx()
        users.plot(total["t"], total["users"], color="grey", linestyle=":", label="users")
        users.set_ylabel("users")
        users.set_ylim(bottom=0)
    lat.set_ylabel("end-to-end latency (s)\nsolid p50, dashed p90")
    first.set_ylabel("first token / audio (s)\nsolid p50, dashed p90")
    rps.set_ylabel("requests/s")
    rps.set_xlabel("time since start (s)")
    for ax in (lat, first, rps):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.08 if ax is rps else 1.01, 1))
    lat.set_title(title or "omniray load test (Locust): current-window percentiles and throughput")
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    plt.close(fig)


def write(prefix: Path, meta: dict | None = None) -> dict:
    """summary.json, summary.md and locust.png next to the CSVs; returns the summary."""
    summary = summarize(prefix, meta)
    out = prefix.parent
    results.write_summary(out, summary, markdown(summary))
    plot(prefix, out / "locust.png", (meta or {}).get("title", ""))
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix", type=Path, help="the --csv prefix Locust wrote")
    summary = write(ap.parse_args().prefix)
    print(markdown(summary))
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
