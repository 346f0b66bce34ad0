"""`runtime.stop` ends every process of its run, and only those, and unlinks the POSIX shared memory
they mapped: vLLM's engine-core ↔ worker queues (psm_*, 4 per `tiny` run) outlived every stop
before."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from multiprocessing import shared_memory

import psutil
import pytest

from services import runtime
from services.common import shm
from tests.faults import SEGMENT_HOLDER


def _holder(run_id: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, runtime.RUN_ID_ENV: run_id}
    proc = subprocess.Popen(
        [sys.executable, "-c", SEGMENT_HOLDER], env=env, stdout=subprocess.PIPE, text=True
    )
    name = proc.stdout.readline().strip()
    assert name, "the holder did not create its segment"
    return proc, name


def _stop(run_dir, run_id: str) -> None:
    """`runtime.stop` on a run of these processes (no Ray, no Redis: nothing else to end)."""
    ports = dict.fromkeys(("http_port", "grpc_port", "gcs_port", "dashboard_port", "redis_port"), 0)
    runtime.LocalCluster(run_dir=run_dir, run_id=run_id, **ports).save()
    runtime.stop(run_dir, log=lambda *_: None, graceful=False)


@pytest.mark.skipif(not os.path.isdir(shm.SHM_DIR), reason="no /dev/shm")
def test_stop_ends_the_runs_processes_and_unlinks_their_shared_memory(tmp_path):
    run_id, other_run = uuid.uuid4().hex, uuid.uuid4().hex
    ours, our_segment = _holder(run_id)
    theirs, their_segment = _holder(other_run)  # another run on the same machine
    kept = shared_memory.SharedMemory(create=True, size=4096)  # this process's, not the run's
    try:
        assert shm.mapped(runtime.processes(run_id)) == {shm.SHM_DIR + our_segment}
        _stop(tmp_path, run_id)

        assert ours.wait(timeout=10) is not None
        assert not os.path.exists(shm.SHM_DIR + our_segment)
        assert theirs.poll() is None and os.path.exists(shm.SHM_DIR + their_segment)
        assert os.path.exists(shm.SHM_DIR + kept.name)
        assert not (tmp_path / "state.json").exists()
    finally:
        for proc in (ours, theirs):
            proc.kill()
            proc.wait(timeout=10)
        for name in (our_segment, their_segment):
            if os.path.exists(shm.SHM_DIR + name):
                os.unlink(shm.SHM_DIR + name)
        kept.close()
        kept.unlink()


def test_a_process_gone_meanwhile_maps_nothing():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    gone = psutil.Process(proc.pid)
    proc.wait(timeout=10)
    assert shm.mapped([gone]) == set()


# A process of the run that, told to end, brings up another before it goes (a raylet restarting an
# agent as it shuts down): the new one, not in the list stop took first, is ended too.
RESPAWNER = """
import os, signal, subprocess, sys, time
def respawn(*_):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    time.sleep(0.5)
    sys.exit(0)
signal.signal(signal.SIGTERM, respawn)
print("ready", flush=True)
time.sleep(120)
"""


def test_stop_ends_a_process_the_run_started_as_it_went_down(tmp_path):
    run_id = uuid.uuid4().hex
    env = {**os.environ, runtime.RUN_ID_ENV: run_id}
    proc = subprocess.Popen([sys.executable, "-c", RESPAWNER], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        _stop(tmp_path, run_id)
        assert proc.wait(timeout=10) == 0  # it ended as told, after bringing up another
        assert runtime.processes(run_id) == []
    finally:
        for left in [proc, *runtime.processes(run_id)]:
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                left.kill()
