"""Every metric omniray exports, declared once: name, type, labels, help and buckets.

Code creates its metrics from here (services/common/telemetry.py `metric(name)`), the engine
processes' recordings are replayed into these (services/extensions/vllm/engine_metrics.py), and the
dashboard tests check every series a shipped dashboard reads against this catalog. Ray's Prometheus
endpoint exports each as `ray_<name>`. The KV store declares its own (kv_store/metrics.py SPEC, a
library that knows nothing of services) and is listed here from that declaration. Pure data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kv_store import metrics as kv_metrics

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
DECISION_BUCKETS_S = (0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01)
FRAME_BUCKETS_S = (0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2)
RESUME_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass(frozen=True)
class Metric:
    name: str
    kind: Literal["counter", "gauge", "histogram"]
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None  # histograms
    # Counters and gauges: every series exported at 0 from the start (a healthy run shows zeros, not
    # "no data"); the code that makes the metric names the label values (extensions/ray/metrics.py).
    at_zero: bool = False

    def __post_init__(self):
        if self.at_zero and self.kind == "histogram":
            raise ValueError(f"{self.name}: a histogram has no value to start at")


def _declared() -> list[Metric]:
    c, g, h = "counter", "gauge", "histogram"
    return [
        # gateway (services/gateway/server.py)
        Metric("omniray_gateway_requests_total", c, "Requests by API and outcome.", ("api", "code")),
        Metric(
            "omniray_gateway_offered_load_total",
            c,
            "Load admitted, by kind (requests, text tokens, image tiles, audio and realtime session seconds): "
            "what the SLA autoscaling policy sizes stages by.",
            ("kind",),
            at_zero=True,
        ),
        Metric("omniray_gateway_ttft_seconds", h, "Arrival to first text token.", (), LATENCY_BUCKETS_S),
        Metric("omniray_audio_ttfp_seconds", h, "Arrival to first audio chunk.", (), LATENCY_BUCKETS_S),
        Metric("omniray_gateway_e2e_seconds", h, "Arrival to last chunk.", ("api",), LATENCY_BUCKETS_S),
        Metric(
            "omniray_gateway_audio_rtf_ratio",
            h,
            "Real-time factor of a response with audio: arrival to last audio chunk / audio seconds.",
            ("api",),
            RTF_BUCKETS,
        ),
        Metric(
            "omniray_gateway_audio_sent_seconds_total",
            c,
            "Seconds of audio sent to clients (chat responses).",
            ("api",),
        ),
        Metric(
            "omniray_gateway_transcribed_audio_seconds_total",
            c,
            "Seconds of audio transcribed (audio transcriptions, realtime input transcription).",
            ("api",),
        ),
        Metric(
            "omniray_gateway_tool_calls_total",
            c,
            "Function calls made by answers, by tool_choice (auto: found by the profile's tool parser).",
            ("choice",),
            at_zero=True,
        ),
        Metric(
            "omniray_engine_session_kv_turns_total",
            c,
            "Realtime turns on a decode replica's long-lived session requests (engine.session_kv): appended to the session's request, started or restarted (windowed), or run as its own request (one_off: a second response of the session at once, or every kept request in a turn).",
            ("outcome",),
            at_zero=True,
        ),
        Metric(
            "omniray_engine_shm_reclaimed_total",
            c,
            "Shared-memory segments (vLLM's engine-core/worker queues in /dev/shm) of engines that died without unlinking them, unlinked by an engine starting on the same node.",
            at_zero=True,
        ),
        Metric(
            "omniray_engine_session_kv_requests",
            g,
            "Long-lived session requests open on a decode replica (engine.session_kv).",
            at_zero=True,
        ),
        Metric(
            "omniray_gateway_decode_resumes_total",
            c,
            "Responses whose decode was lost mid-stream (its replica died or stalled past its deadline, "
            "or its engine dropped the request): resumed from the tokens sent, or failed.",
            ("outcome", "cause"),
            at_zero=True,
        ),
        Metric(
            "omniray_gateway_stage_stalls_total",
            c,
            "Calls to a stage replica cancelled past their deadline (pipeline.stage_deadlines): no reply "
            "or first item within reply_s, or no next item within between_s.",
            ("stage", "wait"),
            at_zero=True,
        ),
        Metric(
            "omniray_gateway_decode_resume_seconds",
            h,
            "The hiccup of a resumed response: the replica's loss to its next token.",
            (),
            RESUME_BUCKETS_S,
        ),
        Metric(
            "omniray_gateway_audio_stall_seconds_total",
            c,
            "Seconds a client playing audio from its first chunk in real time waits for the next.",
            ("api",),
            at_zero=True,
        ),
        # WebRTC calls (services/gateway/webrtc.py)
        Metric(
            "omniray_gateway_webrtc_calls",
            g,
            "Open realtime calls over WebRTC on this gateway replica.",
            at_zero=True,
        ),
        Metric(
            "omniray_gateway_webrtc_input_dropped_seconds_total",
            c,
            "Seconds of a WebRTC caller's microphone audio dropped because its session fell behind.",
            at_zero=True,
        ),
        Metric(
            "omniray_gateway_webrtc_playout_late_seconds_total",
            c,
            "Seconds the audio going out to WebRTC callers fell behind real time (the gateway starved) "
            "and was delayed rather than sent in a burst.",
            at_zero=True,
        ),
        # quota (services/gateway/quota.py)
        Metric(
            "omniray_quota_rejections_total",
            c,
            "Requests refused by the quota service (429/401), by what ran out.",
            ("tenant", "modality", "reason", "slo_class"),
        ),
        Metric("omniray_quota_admitted_total", c, "Requests admitted.", ("tenant", "slo_class")),
        Metric(
            "omniray_quota_bucket_remaining_ratio",
            g,
            "Bucket level after the last admission, as a share of its capacity (burst).",
            ("tenant", "modality"),
        ),
        Metric(
            "omniray_quota_batch_queue_depth",
            g,
            "Over-budget batch requests waiting in this gateway replica.",
            ("tenant",),
        ),
        Metric(
            "omniray_quota_queue_wait_seconds",
            h,
            "Time an admitted request waited for budget (0 for most).",
            ("slo_class",),
            LATENCY_BUCKETS_S,
        ),
        Metric(
            "omniray_quota_redis_errors_total",
            c,
            "Quota calls that found Redis down or stalled (answered 503, or admitted unmetered for "
            "fail_open tenants; a release's refund is lost).",
            ("op",),
            at_zero=True,
        ),
        Metric(
            "omniray_quota_unmetered_total",
            c,
            "Requests and realtime session calls admitted without a debit because Redis was unreachable "
            "(tenants with fail_open).",
            ("tenant", "slo_class"),
        ),
        Metric(
            "omniray_quota_tenants_reload_errors_total",
            c,
            "Tenants-file versions that could not be loaded (the last good one stays).",
            at_zero=True,
        ),
        # realtime (services/realtime/stats.py)
        Metric(
            "omniray_realtime_sessions",
            g,
            "Open realtime sessions (WebSocket and gRPC) on this gateway replica.",
        ),
        Metric(
            "omniray_realtime_admission_limit", g, "Realtime sessions the AIMD controller admits now (N*)."
        ),
        Metric(
            "omniray_realtime_pool_refused_total",
            c,
            "Realtime sessions refused: every realtime decode replica holds its cap of sessions.",
            at_zero=True,
        ),
        Metric(
            "omniray_realtime_admitted_total",
            c,
            "Realtime sessions admitted (opened under the admission limit).",
        ),
        Metric(
            "omniray_realtime_rejected_total",
            c,
            "Realtime sessions refused at the admission limit.",
            at_zero=True,
        ),
        Metric(
            "omniray_realtime_session_saves_total",
            c,
            "Realtime session states saved for a reconnect, by outcome (ok, failed, taken: resumed elsewhere).",
            ("outcome",),
            at_zero=True,
        ),
        Metric(
            "omniray_realtime_session_resumes_total",
            c,
            "Realtime sessions resumed by a reconnecting client, by outcome (ok, not_found).",
            ("outcome",),
            at_zero=True,
        ),
        Metric(
            "omniray_realtime_session_migrations_total",
            c,
            "Realtime sessions moved off a draining gateway replica at a turn boundary (omniray.session.migrate).",
            at_zero=True,
        ),
        Metric(
            "omniray_realtime_barge_ins_total",
            c,
            "Speech that started over a response being generated or played.",
            at_zero=True,
        ),
        Metric(
            "omniray_realtime_wasted_tokens_total",
            c,
            "Generated tokens the user never heard (cut by a barge-in).",
            at_zero=True,
        ),
        Metric("omniray_realtime_generated_tokens_total", c, "Tokens generated for realtime responses."),
        Metric(
            "omniray_realtime_prefill_ahead_total",
            c,
            "Speculative prefills of turns still being spoken, by outcome.",
            ("outcome",),
            at_zero=True,
        ),
        Metric(
            "omniray_realtime_prefill_ahead_tokens_total",
            c,
            "Prompt tokens prefilled while the user was still speaking.",
            at_zero=True,
        ),
        Metric(
            "omniray_realtime_history_turns_dropped_total",
            c,
            "Oldest conversation turns dropped so that a response's request fits its limits.",
            at_zero=True,
        ),
        # stages (services/stages/)
        Metric(
            "omniray_stage_latency_seconds",
            h,
            "Processing time of one stage call (whole stream for streaming calls).",
            ("stage", "op"),
            LATENCY_BUCKETS_S,
        ),
        Metric("omniray_stage_errors_total", c, "Stage calls that raised.", ("stage", "op"), at_zero=True),
        Metric(
            "omniray_stage_inflight_requests",
            g,
            "Calls a replica is processing now (for an engine stage: its running batch).",
            ("stage",),
        ),
        Metric(
            "omniray_stage_urgency_wait_seconds",
            h,
            "Time a talker/vocoder step waited for a slot of its replica's urgency gate.",
            ("stage",),
            (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
        ),
        Metric(
            "omniray_stage_step_streams",
            h,
            "Streams (talker) or chunks (vocoder) one batched forward of a speech stage replica served"
            " (one bucket per count up to 16: Ray exports a histogram's sum from bucket midpoints, so the"
            " mean is read from the buckets).",
            ("stage",),
            (*range(1, 17), 24, 32, 48, 64),
        ),
        Metric(
            "omniray_stage_step_seconds",
            h,
            "Time of one batched forward of a speech stage replica.",
            ("stage",),
            FRAME_BUCKETS_S,
        ),
        Metric(
            "omniray_stage_queue_wait_seconds",
            h,
            "Time a speech stage stream waited for a slot of its replica (talker), or a chunk for its"
            " batch (vocoder).",
            ("stage",),
            (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        ),
        Metric(
            "omniray_stage_active_streams",
            g,
            "Streams a speech stage replica steps now (its slots in use), and those waiting for a slot.",
            ("stage", "state"),
        ),
        Metric(
            "omniray_decode_stream_takeovers_total",
            c,
            "A resumed decode taking the lost one's token stream over (services/dataplane/token_stream.py):"
            " continued, overlap (tokens it held past the answer sent, not written again), filled (tokens"
            " it lacked, written); fenced: a decode whose writes were refused, a later one having taken over.",
            ("outcome",),
            at_zero=True,
        ),
        # token talkers (services/stages/speech.py; Qwen3-Omni)
        Metric("omniray_talker_frames_total", c, "Codec frames a token talker drew.", at_zero=True),
        Metric(
            "omniray_talker_streams_total",
            c,
            "Token talker responses by how they ended: codec_eos (the talker ended itself), text_budget"
            " (its share of frames for the text: max_frames_per_token), max_frames, error.",
            ("end",),
            at_zero=True,
        ),
        Metric("omniray_encoder_tiles_total", c, "Image tiles encoded."),
        Metric(
            "omniray_encoder_streamed_items_total",
            c,
            "Images of stream requests by outcome: written to the replica's NIXL feature pool as they were"
            " encoded (streamed to the thinker), or sent whole because the pool had no room for them.",
            ("outcome",),
            at_zero=True,
        ),
        Metric(
            "omniray_encoder_feature_pool_bytes",
            g,
            "Bytes of features the replica's NIXL feature pool holds.",
        ),
        Metric(
            "omniray_realtime_camera_frames_total",
            c,
            "Camera frames of realtime sessions: held for the next turn, dropped over the frame rate or"
            " as near-duplicates, evicted from the window, joined to a committed turn.",
            ("outcome",),
            at_zero=True,
        ),
        Metric(
            "omniray_router_tile_policy_reduced_total",
            c,
            "Requests whose images got the overload tile policy (the encoder pool overloaded; below the"
            " realtime SLO class).",
            ("slo_class",),
            at_zero=True,
        ),
        Metric(
            "omniray_router_encoder_queue_wait_seconds",
            g,
            "The encoder queue wait this gateway sees (smoothed, decaying): what the overload tile"
            " policy goes by.",
        ),
        # the video pre-stage (services/stages/video.py)
        Metric(
            "omniray_video_frames_total",
            c,
            "Video frames the pre-stage sampled, kept as key frames, and dropped as near-duplicates.",
            ("kind",),
            at_zero=True,
        ),
        Metric("omniray_encoder_batch_tiles", h, "Tiles per encoder batch.", (), (1, 2, 4, 8, 16, 32, 64)),
        Metric("omniray_encoder_pending_tiles", g, "Tiles waiting in this replica."),
        Metric("omniray_encoder_cache_requests_total", c, "Feature cache lookups.", ("modality", "result")),
        Metric(
            "omniray_encoder_feature_version_mismatch_total",
            c,
            "Encoder outputs rejected for carrying other model versions (then re-encoded).",
            ("modality",),
            at_zero=True,
        ),
        # replica routing (services/extensions/ray/request_router.py)
        Metric(
            "omniray_router_decision_seconds",
            h,
            "Time to rank a stage's replicas for one request (the scorer pipeline).",
            ("deployment",),
            (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2),
        ),
        Metric(
            "omniray_router_first_choice_total",
            c,
            "Requests routed to the replica the pipeline ranked first (vs a fallback).",
            ("deployment", "outcome"),
        ),
        Metric(
            "omniray_router_session_seats_total",
            c,
            "Calls of realtime decode pool sessions by seat: kept, placed, migrated, overflow, full, unavailable.",
            ("deployment", "outcome"),
            at_zero=True,
        ),
        Metric("omniray_realtime_pool_seats", g, "Realtime decode pool seats: held, all.", ("state",)),
        # the engine core's scheduler (services/extensions/vllm/scheduler.py; recorded in the engine core)
        Metric(
            "omniray_scheduler_decision_seconds",
            h,
            "Time the scheduler's urgency policy takes per scheduling round (ordering running and waiting requests, preempting).",
            ("policy",),
            DECISION_BUCKETS_S,
        ),
        Metric(
            "omniray_scheduler_frame_seconds",
            h,
            "The engine's frame time: the period of its steps while busy (one more token for every running request); realtime admission compares it with the audio a token yields.",
            (),
            FRAME_BUCKETS_S,
        ),
        Metric(
            "omniray_scheduler_urgency_faults_total",
            c,
            "Scheduling rounds run in vLLM's order because the urgency policy raised (a bug; logged at most once a minute).",
        ),
        Metric(
            "omniray_scheduler_ranked_total",
            c,
            "Running requests ranked per round, by urgency class (U0, U1, U2, held, fcfs).",
            ("urgency",),
        ),
        Metric(
            "omniray_scheduler_kv_blocks_reordered_total",
            c,
            "Free KV blocks of vLLM's pool moved by next use (services/extensions/vllm/block_order.py):"
            " to the tail (protected: the session speaks or just heard a reply) or the head (evicted first).",
            ("to",),
        ),
        Metric(
            "omniray_scheduler_yielded_total",
            c,
            "Running requests that sat a round out for a new realtime turn (LiveServe's yield_to_turns: well-buffered, refill not yet due), summed over rounds.",
        ),
        Metric(
            "omniray_scheduler_streamed_feature_waits_total",
            c,
            "Waits of a request's prefill for an image streamed by the encoder pool, by how they ended:"
            " arrived, or timed_out (the request failed).",
            ("outcome",),
        ),
        Metric(
            "omniray_scheduler_streamed_feature_wait_seconds_total",
            c,
            "Seconds prefills waited for streamed images (from the first step a request could not go on"
            " to the step it could), by outcome: with the waits, their mean.",
            ("outcome",),
        ),
        Metric(
            "omniray_scheduler_prompt_tokens_computed_total",
            c,
            "Prompt tokens the engine computed, streaming-input chunks included (vLLM's prompt_tokens_by_source counts a request's first prefill only): with session KV, a turn's new tokens.",
        ),
        Metric(
            "omniray_scheduler_preemptions_total",
            c,
            "Running requests preempted to seat a more urgent waiting one, by the urgency of the one seated.",
            ("urgency",),
        ),
        # the KV store (kv_store/metrics.py), recorded in the engine processes
        *(
            Metric(
                name, kind, help_, labels, tuple(kv_metrics.TRANSFER_BUCKETS) if kind == "histogram" else None
            )
            for kind, name, help_, labels in kv_metrics.SPEC.values()
        ),
    ]


CATALOG: dict[str, Metric] = {m.name: m for m in _declared()}
