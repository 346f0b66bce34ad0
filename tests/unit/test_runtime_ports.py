"""A local run's listening ports come from below the kernel's ephemeral range (services/runtime.py),
where no outgoing connection is given them while the run starts (HAProxy failed to bind its
listeners in two of eight starts one afternoon, with ports picked inside that range)."""

from __future__ import annotations

import random
import socket

import pytest

from services import runtime


def test_ports_are_free_and_clear_of_the_ephemeral_range():
    span = runtime._listen_range()
    if span is None:
        pytest.skip("this machine's ephemeral range leaves no room below it")
    first = runtime.free_port_range(2 * runtime.INGRESS_PORTS)
    ports = [runtime.free_port() for _ in range(20)] + list(range(first, first + 2 * runtime.INGRESS_PORTS))
    assert all(span[0] <= port <= span[1] for port in ports)
    with socket.socket() as s:  # free: bindable on every address
        s.bind(("", ports[0]))


def test_ports_taken_are_not_handed_out_and_the_search_ends(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        monkeypatch.setattr(runtime, "_listen_range", lambda: (port, port))
        with pytest.raises(RuntimeError, match="no 1 free"):
            runtime.free_port()


def test_no_room_below_the_ephemeral_range_falls_back_to_the_kernels_pick(monkeypatch, tmp_path):
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("1024\t65000\n")
    monkeypatch.setattr(runtime, "EPHEMERAL_PORTS", str(ranges))
    assert runtime._listen_range() is None
    with socket.socket() as s:
        s.bind(("", runtime.free_port()))


def test_a_seeded_random_module_does_not_repeat_the_ports():
    """Two processes that seeded `random` alike (vLLM seeds it) must not draw the same ports."""
    drawn = []
    for _ in range(2):
        random.seed(0)
        drawn.append([runtime.free_port() for _ in range(5)])
    assert drawn[0] != drawn[1]


def test_every_process_of_the_node_finds_the_runs_redis(tmp_path):
    """Serve's controller is not a replica (no app runtime_env): it runs the SLA autoscaling policy,
    which reads the load counters from the run's Redis — `make bench-planner` found it reading none."""
    from services.common.redis_config import ENV

    cluster = runtime.LocalCluster(tmp_path, 1, 2, 3, 4, redis_port=6390)
    assert runtime._ray_env(cluster)[ENV] == "redis://127.0.0.1:6390/0"
