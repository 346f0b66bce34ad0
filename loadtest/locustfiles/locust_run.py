"""`make loadtest`: start omniray (the local runtime of `make run`, on a profile, with the load-test
tenants), run Locust headless against it, stop it (also on failure or Ctrl-C), then write Locust's
CSVs, summary.json / summary.md and locust.png under loadtest/results/<time>/. Exits non-zero when
any request failed (or none was made).

    python -m loadtest.locustfiles.locust_run --profile tiny --users 8 --run-time 75s
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from loadtest import results
from loadtest.locustfiles import locust_report
from services import runtime
from services.common.paths import REPO_ROOT
from services.models.profile import load_profile
from services.quota import LOCAL_API_KEY

TENANTS = REPO_ROOT / "configs" / "tenants" / "loadtest.yaml"


def warm_up(http_url: str, model: str) -> None:
    """One text and one spoken answer before the clock starts: first calls load and compile."""
    headers = {"Authorization": f"Bearer {LOCAL_API_KEY}"}
    for extra in ({}, {"modalities": ["text", "audio"], "audio": {"voice": "default", "format": "pcm16"}}):
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Hello there"}],
            "max_tokens": 8,
            **extra,
        }
        httpx.post(
            f"{http_url}/v1/chat/completions", json=body, headers=headers, timeout=300
        ).raise_for_status()


def locust_command(args, host: str, prefix: Path) -> list[str]:
    return [
        str(Path(sys.executable).parent / "locust"),
        "-f", str(REPO_ROOT / "loadtest" / "locustfiles" / "locustfile.py"),
        "--headless", "--only-summary",
        "--users", str(args.users), "--spawn-rate", str(args.spawn_rate), "--run-time", args.run_time,
        "--host", host,
        "--csv", str(prefix), "--csv-full-history",
        "--stop-timeout", "60",  # users finish the request in hand: a cut stream is no failure
        "--logfile", str(prefix.parent / "locust.log"),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--spawn-rate", type=float, default=1.0)
    ap.add_argument("--run-time", default="75s")
    ap.add_argument("--http-port", type=int, default=0, help="0: a free port")
    ap.add_argument("--grpc-port", type=int, default=0, help="0: a free port")
    ap.add_argument("--out", type=Path, default=None, help="default loadtest/results/<time>")
    args = ap.parse_args(argv)
    out = args.out or results.folder()
    out.mkdir(parents=True, exist_ok=True)
    prefix = out / "locust"
    # The runtime's processes inherit it: the gateway's quota service reads this tenants file.
    os.environ.setdefault("OMNIRAY_TENANTS_FILE", str(TENANTS))
    model = load_profile(args.profile).served_model_name
    run_dir = out / "run"  # its own run: a developer's `make run` (.run/) keeps running
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed run still stops the system
    started = time.monotonic()
    cluster = runtime.start(
        args.profile,
        http_port=args.http_port or runtime.free_port(),
        grpc_port=args.grpc_port or runtime.free_port(),
        run_dir=run_dir,
    )
    try:
        print(f"[loadtest] {args.profile!r} ready in {time.monotonic() - started:.0f}s at {cluster.http_url}, "
              f"gRPC {cluster.grpc_target}; tenants {os.environ['OMNIRAY_TENANTS_FILE']}", flush=True)  # fmt: skip
        warm_up(cluster.http_url, model)
        cmd = locust_command(args, cluster.http_url, prefix)
        env = {**os.environ, "LOADTEST_MODEL": model, "LOADTEST_GRPC_TARGET": cluster.grpc_target}
        print(f"[loadtest] {shlex.join(cmd)}", flush=True)
        rc = subprocess.run(cmd, env=env, check=False).returncode
    finally:
        runtime.stop(run_dir)
    summary = locust_report.write(
        prefix,
        {
            "profile": args.profile,
            "users": args.users,
            "spawn_rate": args.spawn_rate,
            "run_time": args.run_time,
            "locust_exit_code": rc,
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
            "command": shlex.join(
                ["python", "-m", "loadtest.locustfiles.locust_run", *(argv or sys.argv[1:])]
            ),
            "title": f"omniray {args.profile}: {args.users} Locust users, {args.run_time}",
        },
    )
    print(locust_report.markdown(summary))
    print(f"[loadtest] results in {out}")
    return 0 if rc == 0 and summary["requests"] and not summary["failures"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
