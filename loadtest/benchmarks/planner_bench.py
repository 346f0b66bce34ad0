"""`make bench-planner`: the SLA autoscaling policy against Serve's default on a real deployment, the
same load steps side by side in one run (`make simulate-planner` is the simulated twin).

Two deployments of `--profile` (`tiny`), one after the other, the same in all but the policy of the
stages the steps load: Encoder, Decode, Talker and Vocoder autoscale within the same bounds and
delays, by Serve's default policy (queue length against `target_ongoing_requests`) in one and by
omniray's SLA policy (services/extensions/ray/sla_autoscaling.py: the offered load the gateways count,
against `--*-per-replica`) in the other. On each:

1. a trickle of text chat (`--chat-rps`) for `--warm-s`;
2. the image step: requests with one fresh image (`--image-width` x `--image-height`) at
   `--image-rps` for `--step-s` (the trickle goes on);
3. `--quiet-s` of the trickle alone;
4. the voice step: `--sessions` realtime voice sessions (server VAD, spoken replies, played at real
   time: loadtest/benchmarks/voice_bench.py's client) for `--step-s`.

Measured on the client: image requests' time to first token, voice turns' audio TTFP; and the
running replicas of every deployment, read from Serve every 0.5 s. Printed per policy and step: when
each deployment first grew after the step began, its most replicas, when the step's SLO (`--image-slo-s`,
`--voice-slo-s`) was first passed (the first one-second bin whose P90 is over it) and the SLO-violation
seconds (such bins during the step).

    python -m loadtest.benchmarks.planner_bench --profile tiny
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import io
import json
import statistics
import threading
import time
import urllib.request

import httpx
import numpy as np
from PIL import Image

from loadtest import results
from loadtest.benchmarks.voice_bench import Client
from loadtest.clients.client import stream_chat
from loadtest.clients.speech import SENTENCES, speech
from planner.autoscale_bench import violations
from planner.sim.report import quantile
from services import runtime
from services.app import DEPLOYMENT_NAMES, SLA_POLICY
from services.models.profile import load_profile
from services.quota import LOCAL_API_KEY

SCALED = ("encoder", "decode", "talker", "vocoder")


def overrides(args, policy: str) -> dict[str, dict]:
    """The scaled stages' options: the profile's autoscaling (a fixed stage gets 1 to `--max-replicas`),
    with the SLA policy's capacities in the `sla` arm."""
    profile = load_profile(args.profile)
    per_replica = {
        "encoder": {"image_tiles": args.encoder_per_replica},
        "decode": {"requests": args.decode_per_replica},
        "talker": {"session_seconds": args.talker_per_replica},
        "vocoder": {"session_seconds": args.talker_per_replica},
    }
    out = {}
    for stage in SCALED:
        scaling = copy.deepcopy(profile.stages[stage].autoscaling_config) or {
            "min_replicas": 1, "target_ongoing_requests": 8}  # fmt: skip
        scaling.update(max_replicas=args.max_replicas, upscale_delay_s=2.0, downscale_delay_s=60.0)
        if policy == "sla":
            scaling["policy"] = {
                "policy_function": SLA_POLICY,
                "policy_kwargs": {"per_replica": per_replica[stage], "window_s": 5.0},
            }
        out[stage] = {"num_replicas": None, "autoscaling_config": scaling}
    return out


def image_body(model: str, seed: int, width: int, height: int) -> dict:
    """A chat request with one fresh random image (`tiny`'s 128 px tiles: 512 x 256 is 4 x 2 tiles)."""
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    content = [
        {"type": "text", "text": "What is in the picture?"},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 8}


class Replicas:
    """Running replicas of every deployment, read from Serve's REST API every 0.5 s."""

    def __init__(self, dashboard_url: str):
        self.url, self.history = f"{dashboard_url}/api/serve/applications/", []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    app = json.load(r)["applications"]["omniray"]
                counts = {name: sum(x["state"] == "RUNNING" for x in d["replicas"])
                          for name, d in app["deployments"].items()}  # fmt: skip
                self.history.append((time.monotonic(), counts))
            except (OSError, KeyError, ValueError):
                pass
            self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


async def paced(rate: float, seconds: float, make, out: list) -> None:
    """Requests at `rate` a second (Poisson) for `seconds`, each `await make(i)`; results to `out`."""
    rng, tasks, end = np.random.default_rng(7), [], time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        tasks.append(asyncio.create_task(make(i)))
        i += 1
        await asyncio.sleep(rng.exponential(1 / rate))
    out.extend(await asyncio.gather(*tasks))


async def http_load(url: str, model: str, args, t0: float) -> tuple[list, list]:
    """The chat trickle through the whole run and the image step: (image (finish, TTFT), chat errors)."""
    images: list = []
    async with httpx.AsyncClient(timeout=120, headers={"authorization": f"Bearer {LOCAL_API_KEY}"}) as client:

        async def chat(i: int):
            body = {"model": model, "messages": [{"role": "user", "content": f"Say hi {i}"}], "max_tokens": 8}
            return await stream_chat(client, f"{url}/v1/chat/completions", body)

        async def image(i: int):
            body = image_body(model, i, args.image_width, args.image_height)
            res = await stream_chat(client, f"{url}/v1/chat/completions", body)
            return time.monotonic() - t0, res

        total = args.warm_s + 2 * args.step_s + args.quiet_s
        trickle: list = []
        step = asyncio.create_task(asyncio.sleep(args.warm_s))
        chat_task = asyncio.create_task(paced(args.chat_rps, total, chat, trickle))
        await step
        await paced(args.image_rps, args.step_s, image, images)
        await chat_task
    done = [(t, r.ttft if r.ok else float("inf")) for t, r in images]
    return done, [r.error for r in trickle if not r.ok]


def voice_load(url: str, args, t0: float) -> list:
    """The voice step: `--sessions` sessions for `--step-s`: (audio time, TTFP) per turn."""
    utterances = [speech(s) for s in SENTENCES]
    ws = f"{url.replace('http', 'ws', 1)}/v1/realtime"
    end = time.monotonic() + args.step_s
    out: list = []

    def session(k: int) -> None:
        turn = 0
        while time.monotonic() < end:
            client = Client(ws, utterances[k:] + utterances[:k], 0.0, seed=k * 1000 + turn, tokens=(30, 120))
            stats = client.run(1, turn)
            out.extend((t - t0, v) for t, v in zip(stats.ttfp_at, stats.ttfp_s, strict=True))
            turn += 1

    threads = [threading.Thread(target=session, args=(k,)) for k in range(args.sessions)]
    for t in threads:
        t.start()
        time.sleep(0.3)
    for t in threads:
        t.join()
    return out


def summary(replicas: Replicas, t0: float, start: float, end: float, samples: list, slo_s: float) -> dict:
    """Per scaled deployment: first growth after `start` (s after it) and most replicas in the step;
    the step's first SLO pass (s after it), violation seconds and P90."""
    history = [(t - t0, counts) for t, counts in replicas.history]
    before = next((c for t, c in reversed(history) if t <= start), history[0][1] if history else {})
    grew, most = {}, {}
    for stage in SCALED:
        name = DEPLOYMENT_NAMES[stage]
        during = [(t, c.get(name, 0)) for t, c in history if start <= t < end]
        most[name] = max((n for _, n in during), default=0)
        first = next((t for t, n in during if n > before.get(name, 0)), None)
        grew[name] = None if first is None else round(first - start, 1)
    over = violations(samples, slo_s, start, end)
    values = [v for t, v in samples if start <= t < end]
    return {
        "first_growth_s": grew,
        "most_replicas": most,
        "slo_first_passed_s": None if not over else round(over[0] - start, 1),
        "violation_s": len(over),
        "p90_s": quantile(values, 0.9) if values else None,
        "median_s": statistics.median(values) if values else None,
        "n": len(values),
    }


def run_arm(args, policy: str) -> dict:
    model = load_profile(args.profile).served_model_name
    with runtime.temporary(args.profile, prefix=f"omniray-planner-{policy}-",
                           stage_overrides=overrides(args, policy)) as cluster:  # fmt: skip
        replicas = Replicas(cluster.dashboard_url)
        t0 = time.monotonic()
        voice: list = []
        voice_at = args.warm_s + args.step_s + args.quiet_s

        def voice_later() -> None:
            time.sleep(max(0.0, t0 + voice_at - time.monotonic()))
            voice.extend(voice_load(cluster.http_url, args, t0))

        voice_thread = threading.Thread(target=voice_later)
        voice_thread.start()
        images, chat_errors = asyncio.run(http_load(cluster.http_url, model, args, t0))
        voice_thread.join()
        replicas.stop()
    image_step = (args.warm_s, args.warm_s + args.step_s)
    voice_step = (voice_at, voice_at + args.step_s)
    return {
        "image_step": summary(replicas, t0, *image_step, images, args.image_slo_s),
        "voice_step": summary(replicas, t0, *voice_step, voice, args.voice_slo_s),
        "chat_errors": len(chat_errors),
        "replicas": [(round(t - t0, 1), c) for t, c in replicas.history],
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--warm-s", type=float, default=20.0)
    ap.add_argument("--step-s", type=float, default=60.0)
    ap.add_argument("--quiet-s", type=float, default=20.0)
    ap.add_argument("--chat-rps", type=float, default=0.5)
    ap.add_argument("--image-rps", type=float, default=4.0)
    ap.add_argument("--image-width", type=int, default=512)
    ap.add_argument("--image-height", type=int, default=256)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--max-replicas", type=int, default=2)
    ap.add_argument("--encoder-per-replica", type=float, default=8.0, help="image tiles a second")
    ap.add_argument("--decode-per-replica", type=float, default=20.0, help="requests a second")
    ap.add_argument("--talker-per-replica", type=float, default=2.0, help="voice sessions open")
    ap.add_argument(
        "--image-slo-s", type=float, default=2.0, help="P90 time to first token of image requests"
    )
    ap.add_argument("--voice-slo-s", type=float, default=2.0, help="P90 audio TTFP of voice turns")
    ap.add_argument("--arms", nargs="+", default=["default", "sla"], choices=["default", "sla"])
    args = ap.parse_args(argv)
    report: dict = {"settings": vars(args), "arms": {}}
    for policy in args.arms:
        print(f"[bench-planner] {policy}: deploying {args.profile}", flush=True)
        report["arms"][policy] = arm = run_arm(args, policy)
        for step in ("image_step", "voice_step"):
            print(f"[bench-planner] {policy} {step}: {json.dumps(arm[step])}", flush=True)
    print(f"[bench-planner] wrote {results.write('bench-planner', args.profile, report)}")
    return report


if __name__ == "__main__":
    main()
