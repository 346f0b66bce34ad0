"""`python -m services.cli run|stop`: the local runtime behind `make run` / `make stop`."""

from __future__ import annotations

import argparse
import sys
import time

from services import runtime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omniray")
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="start Redis, Ray and the Serve application for a profile")
    run.add_argument("--profile", default="small")
    run.add_argument("--http-port", type=int, default=8000)
    run.add_argument("--grpc-port", type=int, default=9000)
    sub.add_parser("stop", help="stop everything `run` started")
    args = parser.parse_args(argv)

    if args.cmd == "stop":
        runtime.stop()
        return 0
    t0 = time.monotonic()
    print(f"[omniray] starting profile {args.profile!r} (Redis, Ray, Serve)...", flush=True)
    cluster = runtime.start(args.profile, http_port=args.http_port, grpc_port=args.grpc_port)
    from services.models.profile import load_profile
    from services.quota import LOCAL_API_KEY

    model = load_profile(args.profile).served_model_name
    print(
        f"""
[omniray] ready in {time.monotonic() - t0:.0f}s — profile {args.profile!r}, model {model!r}
  REST (OpenAI-compatible): {cluster.http_url}/v1   e.g.
    curl {cluster.http_url}/v1/chat/completions -H 'Content-Type: application/json' \\
      -H 'Authorization: Bearer {LOCAL_API_KEY}' \\
      -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'
  API key:                  {LOCAL_API_KEY} (tenant 'local', configs/tenants/local.yaml)
  Voice console (browser):  {cluster.http_url}/console  (paste the API key, Connect & talk)
  gRPC (omni.v1.Omni):      {cluster.grpc_target}
  Ray dashboard:            {cluster.dashboard_url}
  Prometheus metrics:       {cluster.metrics_url}
  Redis:                    {cluster.redis_url}
  Stop with: make stop
""",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
