"""The shared-memory ledger (services/common/shm.py): an engine owner that is SIGKILLed leaves its
engine's segments in /dev/shm; the next engine to start on the node unlinks them, and nothing a live
owner maps, nothing another user's ledger could name outside /dev/shm."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from services.common import shm
from tests.faults import SEGMENT_HOLDER

# An engine owner: its child (the engine core, argv[2]) creates a segment as vLLM's MessageQueue
# does; once the child has it mapped, the owner records the ledger entry (argv[1]).
OWNER = """
import subprocess, sys, time
from pathlib import Path
from services.common.shm import ShmLedger
core = subprocess.Popen([sys.executable, "-c", sys.argv[2]], stdout=subprocess.PIPE, text=True)
name = core.stdout.readline().strip()
ShmLedger(Path(sys.argv[1])).record()
print(name, flush=True)
time.sleep(600)
"""

pytestmark = pytest.mark.skipif(not os.path.isdir(shm.SHM_DIR), reason="no /dev/shm")


def _owner(root) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(root), SEGMENT_HOLDER], stdout=subprocess.PIPE, text=True
    )
    name = proc.stdout.readline().strip()
    assert name, "the owner did not record its engine's segment"
    return proc, shm.SHM_DIR + name


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the owner and its engine core (reaped by the owner's parent, this process, for the
    owner; the core is an orphan then)."""
    for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
        p.kill()
    proc.wait(timeout=10)


def test_a_killed_owners_segments_are_unlinked_by_the_next_engine(tmp_path):
    ledger = shm.ShmLedger(tmp_path / "ledger")
    dead, dead_segment = _owner(ledger.root)
    live, live_segment = _owner(ledger.root)
    try:
        assert len(list(ledger.root.glob("*.json"))) == 2
        assert ledger.sweep() == []  # both owners alive: nothing is theirs to free
        _kill_tree(dead)  # SIGKILL: the engine's clean exit never runs
        assert os.path.exists(dead_segment)  # what vLLM leaves behind

        assert ledger.sweep() == [dead_segment]
        assert not os.path.exists(dead_segment) and os.path.exists(live_segment)
        assert len(list(ledger.root.glob("*.json"))) == 1
        assert ledger.sweep() == []
    finally:
        for proc in (dead, live):
            if proc.poll() is None:
                _kill_tree(proc)
        for path in (dead_segment, live_segment):
            if os.path.exists(path):
                os.unlink(path)
    assert ledger.sweep() == [] and not os.path.exists(live_segment)  # unlinked above, record dropped


def test_a_ledger_names_only_files_in_dev_shm(tmp_path):
    ledger = shm.ShmLedger(tmp_path / "ledger")
    ledger.root.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    gone = {"pid": 2**22 + 1, "started": 0.0}  # above pid_max's default: no such owner
    names = [str(victim), shm.SHM_DIR + "../../" + str(victim), shm.SHM_DIR, shm.SHM_DIR + "..", 7]
    (ledger.root / "1-0.json").write_text(json.dumps({**gone, "segments": names}))
    (ledger.root / "2-0.json").write_text("{half a record")
    assert ledger.sweep() == [] and victim.read_text() == "keep"
    assert not (ledger.root / "1-0.json").exists() and (ledger.root / "2-0.json").exists()


def test_a_ledger_another_user_could_write_is_not_read(tmp_path):
    root = tmp_path / "ledger"
    root.mkdir()
    root.chmod(0o777)
    (root / "1-0.json").write_text(json.dumps({"pid": 2**22 + 1, "started": 0.0, "segments": []}))
    assert shm.ShmLedger(root).sweep() == [] and (root / "1-0.json").exists()


def test_a_ledger_it_cannot_create_is_no_ledger(tmp_path):
    """An engine never fails to start over the ledger: a temp dir it cannot use means no ledger."""
    (tmp_path / "a-file").write_text("")
    ledger = shm.ShmLedger(tmp_path / "a-file" / "ledger")  # mkdir fails, even for root
    assert ledger.sweep() == [] and isinstance(ledger.record(), set)
