"""The voice benchmark's workload and figures (loadtest/benchmarks/voice_bench.py), without a deployment."""

from __future__ import annotations

import base64
import http.server
import json
import random
import statistics
import threading
import time
from types import SimpleNamespace

import websockets.sync.server as ws_server
import yaml
from hypothesis import given
from hypothesis import strategies as st

from loadtest.benchmarks.voice_bench import (
    POLICY_SETS,
    Client,
    blocks,
    means_ms,
    profile_file,
    ratios,
    reply_length,
    scrape,
    silent_end,
    useful_rps,
)


@given(st.integers(0, 2**32), st.integers(1, 500), st.integers(0, 500))
def test_reply_lengths_stay_in_range(seed, low, span):
    rng = random.Random(seed)
    assert all(low <= reply_length(rng, low, low + span) <= low + span for _ in range(20))


def test_reply_lengths_are_log_uniform_and_seeded():
    draws = [reply_length(random.Random(7), 30, 300) for _ in range(2)]
    assert draws[0] == draws[1]  # a session's seed gives both arms the same replies
    rng = random.Random(0)
    lengths = [reply_length(rng, 30, 300) for _ in range(4000)]
    # log-uniform: the median is the geometric mean (~95), half the replies under it
    assert 85 < statistics.median(lengths) < 105
    assert 0.45 < sum(n < 95 for n in lengths) / len(lengths) < 0.55


def test_useful_rps_is_the_rate_at_the_most_sessions_within_the_objective():
    def cell(p90, continuous, rate, refused=0):
        return {"turns": 32, "ttfp_p90_s": p90, "continuous_share": continuous, "heard_rps": rate,
                "refused": refused}  # fmt: skip

    runs = {
        "baseline@c=8,p=0.0": cell(0.6, 1.0, 0.2),
        "baseline@c=16,p=0.0": cell(0.9, 1.0, 0.3),
        "baseline@c=24,p=0.0": cell(1.2, 1.0, 0.5),  # too slow
        "interaction@c=8,p=0.0": cell(0.5, 1.0, 0.2),
        "interaction@c=16,p=0.0": cell(0.7, 0.8, 0.3),  # too many stalls
        "interaction@c=24,p=0.0": cell(0.9, 0.95, 0.5),  # a gap below does not stop the sweep
    }
    args = SimpleNamespace(sweep=[8, 16, 24], slo_s=1.0, sets=["baseline", "interaction"])
    assert useful_rps(runs, args) == {
        "baseline": {"sessions": 16, "useful_rps": 0.3},
        "interaction": {"sessions": 24, "useful_rps": 0.5},
    }
    runs["interaction@c=24,p=0.0"] = cell(0.9, 0.95, 0.5, refused=1)  # not all 24 were served
    assert useful_rps(runs, args)["interaction"] == {"sessions": 8, "useful_rps": 0.2}
    runs["baseline@c=8,p=0.0"] = cell(1.5, 1.0, 0.2)
    runs["baseline@c=16,p=0.0"] = cell(1.5, 1.0, 0.3)
    assert useful_rps(runs, args)["baseline"] == {"sessions": None, "useful_rps": 0.0}


def test_each_policy_set_is_a_profile_with_its_scheduler_eviction_and_preload(tmp_path):
    """The baseline has no part of LiveServe's set (preload included: the store's follower preloads
    whatever the eviction policy); each ablation set adds one."""
    args = SimpleNamespace(profile="tiny", hidden=0, max_num_seqs=0, chunk_max_tokens=0)
    seen = {}
    for name in POLICY_SETS:
        data = yaml.safe_load(profile_file(args, name, tmp_path).read_text())
        kv = data["kv_store"]
        seen[name] = (data["realtime"]["scheduler"]["policy"], kv["policy"], kv["follower"]["preload"])
    assert seen == POLICY_SETS
    assert seen["baseline"] == ("fcfs", "lru", False)
    assert seen["interaction"] == ("liveserve", "next_use", True)


def test_ratios_put_each_set_against_the_baseline():
    def cell(p90, wasted):
        return {"turns": 32, "ttfp_p90_s": p90, "continuous_share": 1.0, "heard_rps": 0.2,
                "wasted_tokens": wasted}  # fmt: skip

    runs = {"baseline@c=8,p=0.5": cell(0.9, 100), "+scheduling@c=8,p=0.5": cell(0.6, 40),
            "+preload@c=8,p=0.5": cell(0.9, 100)}  # fmt: skip
    out = ratios(runs, [(8, 0.5)], ["+scheduling", "+preload"])
    assert out["+scheduling c=8,p=0.5"]["ttfp_p90 baseline/+scheduling"] == 1.5
    assert out["+scheduling c=8,p=0.5"]["wasted reduction"] == 0.6
    assert out["+preload c=8,p=0.5"]["wasted reduction"] == 0.0


EXPOSITION = """# HELP ray_omniray_stage_urgency_wait_seconds Time a step waited.
# TYPE ray_omniray_stage_urgency_wait_seconds histogram
ray_omniray_stage_urgency_wait_seconds_bucket{stage="talker",le="+Inf",Component="a"} {count}
ray_omniray_stage_urgency_wait_seconds_sum{stage="talker",Component="a"} {total}
ray_omniray_stage_urgency_wait_seconds_count{stage="talker",Component="a"} {count}
ray_omniray_stage_urgency_wait_seconds_bucket{stage="talker",le="+Inf",Component="b"} 1
ray_omniray_stage_urgency_wait_seconds_sum{stage="talker",Component="b"} 0.5
ray_omniray_stage_urgency_wait_seconds_count{stage="talker",Component="b"} 1
# HELP ray_omniray_gateway_requests_total Not watched.
# TYPE ray_omniray_gateway_requests_total counter
ray_omniray_gateway_requests_total{api="chat"} 3
"""


def test_stage_means_over_a_cell_from_a_metrics_endpoint():
    pages = iter([EXPOSITION.replace("{count}", "10").replace("{total}", "1.0"),
                  EXPOSITION.replace("{count}", "30").replace("{total}", "3.0")])  # fmt: skip

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = next(pages).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        before, after = scrape(url), scrape(url)
    finally:
        server.shutdown()
    # replicas summed; only the watched families
    assert before == {
        "omniray_stage_urgency_wait_seconds_sum{stage=talker}": 1.5,
        "omniray_stage_urgency_wait_seconds_count{stage=talker}": 11.0,
    }
    # 20 more steps waited 2.0 s more over the cell: 100 ms each
    assert means_ms(before, after) == {"omniray_stage_urgency_wait_seconds{stage=talker}": 100.0}


def test_a_refused_session_is_reported_not_raised():
    """A gateway at its session limit closes a new realtime session with 1013 (try again later):
    the bench counts the session refused and goes on, as the sweep's other sessions do."""

    def refuse(conn):
        conn.close(1013, "try again later")

    with ws_server.serve(refuse, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"ws://127.0.0.1:{server.socket.getsockname()[1]}/v1/realtime"
        client = Client(url, [b"\0\0" * 160], 0.0, seed=0)
        stats = client.run(2)
        server.shutdown()
    assert stats.refused and not stats.ttfp_s and stats.errors


@given(st.integers(1, 200), st.integers(1, 12))
def test_blocks_split_the_turns_evenly_in_order(turns, n):
    split = blocks(turns, n)
    assert [first for first, _ in split] == [sum(size for _, size in split[:b]) for b in range(len(split))]
    sizes = [size for _, size in split]
    assert sum(sizes) == turns and min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    assert len(split) == min(n, turns)


def test_a_response_that_ended_without_audio_is_reported_with_why():
    failed = {"status": "failed", "usage": {"output_tokens": 41},
              "status_details": {"type": "failed", "error": {"type": "server_error", "code": "stage_unavailable"}}}  # fmt: skip
    assert silent_end(3, failed) == (3, "failed", "stage_unavailable", 41)
    cut = {"status": "incomplete", "status_details": {"type": "incomplete", "reason": "max_output_tokens"}}
    assert silent_end(5, cut) == (5, "incomplete", "max_output_tokens", 0)
    plain = {"status": "completed", "status_details": None, "usage": None}
    assert silent_end(0, plain) == (0, "completed", "", 0)


def test_an_empty_reply_adds_no_duration_to_draw_barge_ins_from():
    """A reply whose first token ended it (a random-weight thinker samples end-of-text now and
    then) has no audio: a barge-in drawn from its 0 s would cut the next reply at its first audio."""
    audio = base64.b64encode(b"\0\0" * 2400).decode()  # 100 ms at 24 kHz
    done = {
        "type": "response.done",
        "response": {"id": "r", "status": "completed", "usage": {"output_tokens": 1}},
    }
    events = [{"type": "response.created", "response": {"id": "r"}}, done,
              {"type": "response.created", "response": {"id": "r"}},
              {"type": "response.output_audio.delta", "response_id": "r", "item_id": "i", "delta": audio}, done]  # fmt: skip

    def serve(conn):
        conn.recv()  # the session's update
        for event in events:
            conn.send(json.dumps(event))
        for _ in conn:  # until the client goes
            pass

    with ws_server.serve(serve, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"ws://127.0.0.1:{server.socket.getsockname()[1]}/v1/realtime"
        durations: list[float] = []
        client = Client(url, [b"\0\0" * 160], 0.0, seed=0, durations=durations)
        deadline = time.monotonic() + 10
        while client.stats.generated < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        client.rt.close()
        server.shutdown()
    assert client.stats.generated == 2  # both replies' tokens counted
    assert durations == [0.1]  # only the one with audio
