"""POSIX shared memory a vLLM engine leaves behind when it dies.

vLLM's engine core and its workers talk through queues in POSIX shared memory (psm_* files in
/dev/shm: `multiprocessing.shared_memory`, and their semaphores), which vLLM unlinks only when the
engine exits cleanly. An engine that is killed (its replica SIGKILLed or OOM-killed, a node fault)
leaves them: memory lost until the machine or pod restarts (a pod's /dev/shm counts against its
memory), a few segments more every time Serve replaces a replica. `runtime.stop` unlinks what a
local run's processes map. Within a run, an engine's owner (the replica process) records the
segments of its engine in a node-local ledger once the engine is up (`ShmLedger.record`), and every
engine that starts on the node first unlinks the segments of owners that are gone (`sweep`): a
killed replica's are freed when its replacement starts, if that is on the same node."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import psutil

SHM_DIR = "/dev/shm/"


def mapped(procs: list) -> set[str]:
    """The POSIX shared memory (files in /dev/shm, not yet unlinked) these processes (psutil) map."""
    found: set[str] = set()
    for proc in procs:
        try:  # /proc/<pid>/maps, not psutil's memory_maps: that parses smaps, ~40x the time
            with open(f"/proc/{proc.pid}/maps") as f:
                for line in f:  # address perms offset dev inode [path]
                    path = line.rstrip("\n").split(maxsplit=5)[-1]
                    if path.startswith(SHM_DIR) and not path.endswith(" (deleted)"):
                        found.add(path)
        except OSError:  # gone meanwhile
            continue
    return found


def _in_shm(path: str) -> bool:
    """A file directly in /dev/shm (a ledger entry names nothing else)."""
    return (
        path.startswith(SHM_DIR)
        and "/" not in path[len(SHM_DIR) :]
        and path[len(SHM_DIR) :] not in ("", ".", "..")
    )


class ShmLedger:
    """Node-local records of which live process owns which engine's segments: one JSON file per
    owner, named by its pid and start time (a reused pid is another owner), in a directory only this
    user may write."""

    def __init__(self, root: Path | None = None):
        self.root = root or Path(tempfile.gettempdir()) / f"omniray-shm-{os.getuid()}"

    def _ready(self) -> bool:
        """The ledger can be used: ours alone (nobody else's names to unlink), and writable — an
        engine never fails to start over this bookkeeping (a read-only temp dir: no ledger)."""
        try:
            self.root.mkdir(mode=0o700, exist_ok=True)
            st = self.root.stat()
        except OSError:
            return False
        return st.st_uid == os.getuid() and not st.st_mode & 0o022

    def record(self, owner: psutil.Process | None = None) -> set[str]:
        """Record the segments the owner (this process by default) and its children map; returns them."""
        owner = owner or psutil.Process()
        segments = mapped([owner, *owner.children(recursive=True)])
        if not self._ready():
            return segments
        entry = self.root / f"{owner.pid}-{owner.create_time():.2f}.json"
        body = {"pid": owner.pid, "started": owner.create_time(), "segments": sorted(segments)}
        tmp = entry.with_suffix(".tmp")
        with contextlib.suppress(OSError):  # a full disk: this engine's segments go unrecorded
            tmp.write_text(json.dumps(body))
            tmp.replace(entry)  # whole or absent: a sweep never reads half a record
        return segments

    def sweep(self) -> list[str]:
        """Unlink the segments recorded by owners that are gone, and their records; returns what was
        unlinked (segments the engine removed itself on a clean exit are gone already)."""
        if not self._ready():
            return []
        freed = []
        for entry in self.root.glob("*.json"):
            try:
                owner = json.loads(entry.read_text())
                pid, started, segments = int(owner["pid"]), float(owner["started"]), list(owner["segments"])
            except (OSError, ValueError, KeyError, TypeError):
                continue  # not ours to judge
            if _alive(pid, started):
                continue
            for path in segments:
                if isinstance(path, str) and _in_shm(path):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                        freed.append(path)
            entry.unlink(missing_ok=True)
        return freed


def _alive(pid: int, started: float) -> bool:
    """The owner runs (a zombie, killed but not yet reaped, is gone; a reused pid is another)."""
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - started) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
