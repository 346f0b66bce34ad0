"""A real multi-node Ray cluster from the image (`make test-cluster`, after `make image`): the chart's
pods run as KubeRay runs them (tests/image/pods.py) — the head pod and one pod per worker replica of
each group, each joining the head's GCS with the resources the chart gives its pool and the CPUs and
memory KubeRay derives from its limits. The chart is values-cpu-dev (profile tiny) with its thinker
group at two pods and Decode at two replicas (`replicaBounds`, the overlay `make plan` writes), so
two thinker nodes each hold a Decode and one of them the Prefill. On it:

- every stage's replicas run on nodes of its pool, the gateway on the head, Decode one per thinker node;
- a long prompt prefilled on one thinker node and decoded on the other is loaded, not recomputed: the
  decode engine pulls its pages from the prefill engine's pool over NIXL, across the nodes;
- the thinker node without the Prefill is killed (`docker kill`: every process of the pod at once)
  while streamed answers and a realtime session's turn are being decoded: every answer finishes with
  every token asked for (resumed on the surviving node), the session's next turn is served there,
  and Serve places the lost Decode replica again on the node that is left."""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from types import SimpleNamespace

import httpx
import pytest
import yaml

from services import deploy, runtime
from services.realtime.server_events import WHOLE
from tests.chart.helpers import one, values
from tests.conftest import AUTH
from tests.faults import RECOVER_S, Outcome, RealtimeClient, counter, rest_stream, resumes
from tests.image import pods

# past the suite's 600 s: the cluster's start is bounded by its own waits, which fail with the pods' logs
pytestmark = [pytest.mark.image, pytest.mark.cluster, pytest.mark.timeout(1800)]

MODEL = "omniray-tiny"
THINKER_PODS = 2
MAX_TOKENS = 1200  # still streaming when the kill lands
STREAMS = 4


def _cluster_values() -> dict:
    v = copy.deepcopy(values("cpu-dev"))
    thinker = v["ray"]["workerGroups"]["thinker"]
    thinker.update(replicas=THINKER_PODS, minReplicas=THINKER_PODS, maxReplicas=THINKER_PODS)
    v["replicaBounds"] = {"Decode": {"min": THINKER_PODS, "max": THINKER_PODS}}
    return v


def _alive_nodes() -> dict[str, dict]:
    """node name -> Ray's node state, for the nodes alive now."""
    body = json.loads(pods.get(f"{pods.DASHBOARD}/api/v0/nodes?limit=100", timeout=10))
    return {n["node_name"]: n for n in body["data"]["result"]["result"] if n["state"] == "ALIVE"}


def _replicas(deployment: str) -> list[dict]:
    return [r for r in pods.serve_app()["deployments"][deployment]["replicas"] if r["state"] == "RUNNING"]


def _shm(group: dict) -> str:
    """The docker --shm-size for the pod's /dev/shm emptyDir (64m, Docker's, when it has none)."""
    spec = group["template"]["spec"]
    sizes = [v["emptyDir"]["sizeLimit"] for v in spec["volumes"] if v["name"] == "dshm"]
    return f"{int(pods.quantity(sizes[0]) // 2**20)}m" if sizes else "64m"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    docs = deploy.render(_cluster_values())
    service = one(docs, "RayService")
    spec = service["spec"]["rayClusterConfig"]
    head_pod = spec["headGroupSpec"]["template"]["spec"]
    mounts = pods.volumes(tmp_path_factory, docs, head_pod)
    redis_port = runtime.free_port()
    redis = runtime.start_redis(redis_port, tmp_path_factory.mktemp("redis"))
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    run = uuid.uuid4().hex[:6]
    nodes: dict[str, SimpleNamespace] = {}  # container (= Ray node) name -> its pod
    try:
        pods.run_init(head_pod, redis_url, mounts)  # one data volume for every pod
        groups = [("head", spec["headGroupSpec"], 1)] + [
            (g["groupName"], g, g["replicas"]) for g in spec["workerGroupSpecs"]
        ]
        for pool, group, replicas in groups:
            pod = group["template"]["spec"]
            (container,) = pod["containers"]
            for r in range(replicas):
                index = len(nodes)
                name = f"omniray-{run}-{pool}-{r}"
                params = pods.kuberay_params(group, container) | pods.node_ports(index) | {"node-name": name}
                nodes[name] = SimpleNamespace(  # before it starts: removed at the end even if its start fails
                    pool=pool,
                    cpus=float(params["num-cpus"]),
                    metrics=f"http://127.0.0.1:{8080 + index}/metrics",
                )
                pods.start_node(
                    name, pod, container, params, redis_url, mounts, head=not index, shm_size=_shm(group)
                )
                if not index:
                    pods.wait(
                        "Ray's dashboard", lambda: pods.get(f"{pods.DASHBOARD}/api/version"), 180, [name]
                    )
        names = list(nodes)
        pods.wait("every pod's node", lambda: set(_alive_nodes()) == set(names), 180, names)
        t0 = time.monotonic()
        pods.deploy_serve(service)
        pods.wait("the Serve application", lambda: pods.serve_app().get("status") == "RUNNING", 900, names)
        pods.wait("the gateway", pods.gateway_ok, 60, names)
        print(
            f"\n[cluster] {len(nodes)} pods; the Serve application running {time.monotonic() - t0:.0f} s after deploy"
        )
        yield SimpleNamespace(
            url="http://127.0.0.1:8000", nodes=nodes, serve=yaml.safe_load(service["spec"]["serveConfigV2"])
        )
    finally:
        for name in nodes:
            pods.docker("rm", "-f", name, check=False)
        redis.terminate()
        redis.wait(10)


def _node_of(replica: dict, nodes: dict[str, dict]) -> str | None:
    """The replica's node, None while Serve still lists a replica of a node Ray found dead."""
    return next((n for n, state in nodes.items() if state["node_id"] == replica["node_id"]), None)


def _placement() -> dict[str, list[str]]:
    """Serve deployment -> the nodes (pod names) of its running replicas."""
    nodes = _alive_nodes()
    return {d: [_node_of(r, nodes) for r in _replicas(d)] for d in pods.serve_app()["deployments"]}


def test_each_stage_runs_on_a_node_of_its_pool(cluster):
    nodes = _alive_nodes()
    assert set(nodes) == set(cluster.nodes)
    for name, state in nodes.items():  # each pod's node: its pool's resource, its limits' CPUs
        pool, total = cluster.nodes[name].pool, state["resources_total"]
        assert {k for k in total if k.startswith("omniray_pool_")} == {f"omniray_pool_{pool}"}
        assert total["CPU"] == cluster.nodes[name].cpus, (name, total)
    (app,) = cluster.serve["applications"]
    placement = _placement()
    for d in app["deployments"]:
        (resource,) = d["ray_actor_options"]["resources"]
        pool = resource.removeprefix("omniray_pool_")
        assert placement[d["name"]] and {cluster.nodes[n].pool for n in placement[d["name"]]} == {pool}, (
            placement
        )
    # Serve spreads a deployment's replicas over the nodes that can hold them
    assert len(set(placement["Decode"])) == THINKER_PODS, placement
    print(f"\n[cluster] placement: {placement}")


def _long_prompt(i: int) -> str:
    """Past tiny's disagg_min_prompt_tokens (512): prefilled by Prefill, its pages handed to Decode."""
    return f"Request {i}. " + " ".join(f"w{(i * 7919 + k) % 1000}" for k in range(700))


def test_kv_pages_cross_nodes_over_nixl(cluster):
    """The thinker node without the Prefill decodes long prompts from pages pulled over NIXL from
    the prefill engine's pool on the other node, not recomputed.

    A lookup or load whose wait passes its bound (a Redis call 0.5 s, a NIXL read 5 s) falls back to
    computing the prompt by design; on two cores shared by five pods such a wait is timing, not a
    defect, so the test asks that loads were made whole from the other node and reports any fallback
    (a recompute with its reason, a lookup that failed) and where the pages were found."""
    placement = _placement()
    (prefill_node,) = placement["Prefill"]
    (remote,) = [n for n in placement["Decode"] if n != prefill_node]
    metrics = cluster.nodes[remote].metrics

    def totals() -> dict[str, float]:
        return {
            "pulled": counter(metrics, "omniray_kv_bytes_moved_total", path="peer->L2"),
            "loads": counter(metrics, "omniray_kv_reload_seconds_count", kind="pd"),
            **{
                f"recomputed {why}": counter(metrics, "omniray_kv_fallback_recompute_total", reason=why)
                for why in ("load_failed", "load_error")
            },
            **{
                f"lookup {result}": counter(metrics, "omniray_kv_lookups_total", result=result)
                for result in ("peer", "miss", "failed")
            },
            "lookup errors": counter(metrics, "omniray_kv_errors_total", op="lookup"),
        }

    before = totals()
    answers: list[httpx.Response] = []

    def ask(i: int) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": _long_prompt(i)}], "max_tokens": 4}
        answers.append(httpx.post(f"{cluster.url}/v1/chat/completions", json=body, headers=AUTH, timeout=120))

    def made_whole(seen: dict[str, float]) -> float:
        """Loads on the remote node that found every page (a failed one counts as a recompute)."""
        return seen["loads"] - seen["recomputed load_failed"]

    deadline = time.monotonic() + 180
    asked = 0
    while made_whole(now := totals()) <= made_whole(before) or now["pulled"] <= before["pulled"]:
        assert time.monotonic() < deadline, (
            f"no load made whole on {remote} after {asked} long prompts: {now}"
        )
        threads = [threading.Thread(target=ask, args=(asked + k,)) for k in range(4)]  # both Decodes busy
        for t in threads:
            t.start()
        for t in threads:
            t.join(150)
        asked += len(threads)
        time.sleep(3)  # Ray exports metrics with a lag
    assert len(answers) == asked and all(r.status_code == 200 for r in answers), [r.text for r in answers][:2]
    time.sleep(10)  # a recompute's counter, exported as late as the pull's
    seen = {k: v - before[k] for k, v in totals().items()}
    print(
        f"\n[cluster] {seen['pulled'] / 1e6:.1f} MB of KV pages pulled across nodes onto {remote} "
        f"({asked} long prompts; on that node: {seen})"
    )


def test_a_thinker_node_killed_under_load_loses_nothing(cluster):
    placement = _placement()
    (prefill_node,) = placement["Prefill"]
    (victim,) = [n for n in placement["Decode"] if n != prefill_node]
    head_metrics = next(p.metrics for p in cluster.nodes.values() if p.pool == "head")
    before = resumes(head_metrics)
    rt = RealtimeClient(cluster.url, MODEL)
    rt.turn()
    assert rt.wait("response.done", timeout=120)["response"]["status"] in WHOLE
    outs = [Outcome() for _ in range(STREAMS)]
    threads = [threading.Thread(target=rest_stream, args=(cluster.url, MODEL, o, MAX_TOKENS)) for o in outs]
    for t in threads:
        t.start()
    rt.turn()
    rt.wait("response.output_text.delta")
    assert all(o.started.wait(60) for o in outs), "the streams did not start"
    time.sleep(1)

    killed_at = time.monotonic()
    pods.docker("kill", victim)

    seen: list = []
    done = rt.wait("response.done", timeout=RECOVER_S, seen=seen)
    assert done["response"]["status"] in WHOLE, done
    assert not [e for _, e in seen if e["type"] == "error"], seen
    rt.turn()  # the session's next turn, on the node that is left
    assert rt.wait("response.done", timeout=120)["response"]["status"] in WHOLE
    rt.conn.close()
    for t in threads:
        t.join(RECOVER_S)
        assert not t.is_alive(), "a client hung after its node died"
    finished_s = time.monotonic() - killed_at
    for o in outs:
        assert o.error_at is None and (o.finish, o.tokens) == ("length", MAX_TOKENS), o.detail
    # some of them were decoding on the killed node, and were resumed
    deadline = time.monotonic() + 60  # Ray exports metrics with a lag
    while resumes(head_metrics) <= before and time.monotonic() < deadline:
        time.sleep(2)
    resumed = resumes(head_metrics) - before
    assert resumed >= 1
    # Serve places the lost replica again, on the thinker node that is left
    pods.wait(
        "the lost Decode replica placed again",
        lambda: (
            _placement()["Decode"] == [prefill_node] * THINKER_PODS
            and pods.serve_app()["status"] == "RUNNING"
        ),
        RECOVER_S,
        [prefill_node],
    )
    print(f"\n[cluster] {victim} killed: {STREAMS} streams and a realtime turn finished whole "
          f"{finished_s:.0f} s later ({resumed:.0f} resumed); Decode back at {THINKER_PODS} replicas "
          f"{time.monotonic() - killed_at:.0f} s after the kill")  # fmt: skip
