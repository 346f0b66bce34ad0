"""Builds the Serve application and its Serve config from a deploy profile.

`serve_config()` is what `make run` deploys and what the Helm chart puts in the RayService's
serveConfigV2: one application whose ingress is the gateway and whose stages are each their own
deployment, with replicas, autoscaling, concurrency and resources taken from the profile.
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from services.models.profile import STAGES, RequestRouterSpec, load_profile

APP_NAME = "omniray"
REPLICA_GRPC_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
GRPC_SERVICER = "services.gateway.grpc_wire.add_omni_servicer_to_server"
# How Ray runs Serve for omniray, in every process (`ray start`'s environment; the chart's pods): Ray's
# documented high-throughput mode. HAProxy takes the HTTP and gRPC ports and forwards to the gateway
# replicas' own servers (direct ingress: no Python proxy on the token path); handles use Serve's gRPC
# transport; replica code and routers run on the replica's main event loop.
SERVE_ENV = {
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
}
SLA_POLICY = "services.extensions.ray.sla_autoscaling:SlaAutoscaling"
DEPLOYMENT_NAMES = {
    "gateway": "Gateway",
    "video": "Video",
    "encoder": "Encoder",
    "prefill": "Prefill",
    "decode": "Decode",
    "realtime_decode": "RealtimeDecode",
    "talker": "Talker",
    "vocoder": "Vocoder",
}


def build_app(args: dict[str, Any]) -> Application:
    """Serve application builder (`import_path: services.app:build_app`, `args: {profile: ...}`)."""
    from services.gateway.server import Gateway
    from services.stages.encoder import Encoder
    from services.stages.speech import Talker, Vocoder
    from services.stages.thinker import Decode, Prefill
    from services.stages.video import Video

    # Loaded and validated once, here: a bad profile fails the deploy, and every replica gets the
    # content it was deployed with (not a name it would read from disk again).
    loaded = load_profile(str(args["profile"]))
    profile = loaded.model_dump()
    # the realtime decode pool: the same stage as Decode, its own deployment (replicas, seats)
    realtime_decode = (
        Decode.options(name=DEPLOYMENT_NAMES["realtime_decode"]).bind(profile, pool="realtime_decode")
        if "realtime_decode" in loaded.stages
        else None
    )
    return Gateway.bind(
        profile,
        Video.bind(profile),
        Encoder.bind(profile),
        Prefill.bind(profile),
        Decode.bind(profile),
        Talker.bind(profile),
        Vocoder.bind(profile),
        realtime_decode,
        async_chunk=args.get("async_chunk"),
    )


def serve_config(
    profile_name: str,
    *,
    http_port: int = 8000,
    grpc_port: int = 9000,
    host: str = "0.0.0.0",
    app_args: dict[str, Any] | None = None,
    stage_overrides: dict[str, dict] | None = None,
    env_vars: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The Serve config (ServeDeploySchema) for one profile, validated before it is returned.

    `stage_overrides` replaces deployment options per stage (tests shorten autoscaling delays)."""
    from ray.serve.schema import ServeDeploySchema

    profile = load_profile(profile_name)
    deployments = []
    for stage in STAGES:
        spec = profile.stages.get(stage)
        if spec is None:
            continue
        options = spec.model_dump(exclude_none=True, exclude={"request_router", "sla", "sessions"})
        if spec.sla is not None:
            options["autoscaling_config"]["policy"] = {
                "policy_function": SLA_POLICY,
                "policy_kwargs": spec.sla.model_dump(),
            }
        if spec.request_router is not None or spec.sessions is not None:
            router = spec.request_router or RequestRouterSpec(scorers=[{"name": "queue_length"}])
            options["request_router_config"] = {
                "request_router_class": "services.extensions.ray.request_router:ScoredRequestRouter",
                "request_router_kwargs": {
                    "scorers": [s.model_dump() for s in router.scorers],
                    "deployment": DEPLOYMENT_NAMES[stage],
                    # pinned sessions: each turn to its seat's replica (services/router/session_seats.py)
                    "sessions": {"pool": stage, **spec.sessions.model_dump()} if spec.sessions else None,
                },
                "request_routing_stats_period_s": router.stats_period_s,
            }
        options.update((stage_overrides or {}).get(stage, {}))
        deployments.append({"name": DEPLOYMENT_NAMES[stage], **options})
    app: dict[str, Any] = {
        "name": APP_NAME,
        "route_prefix": "/",
        "import_path": "services.app:build_app",
        "args": {"profile": profile_name, **(app_args or {})},
        "deployments": deployments,
    }
    app["runtime_env"] = {
        "env_vars": {
            # Stage messages carry descriptors and small inline tensors; this bounds the worst case.
            "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(REPLICA_GRPC_MAX_MESSAGE_BYTES),
            **(env_vars or {}),
        }
    }
    config = {
        "proxy_location": "HeadOnly",
        "http_options": {"host": host, "port": http_port, "request_timeout_s": 600},
        "grpc_options": {
            "port": grpc_port,
            "grpc_servicer_functions": [GRPC_SERVICER],
            # grpcurl and other clients discover omni.v1 without our .proto files
            "enable_reflection": True,
        },
        "applications": [app],
    }
    ServeDeploySchema.model_validate(config)
    return config
