"""What the Ray tests share: Ray on loopback in a temp dir of the test's own, the launcher as a
process, the processes a test started (found by that temp dir in their environment, never by
name), and two checkpoints compared with the tolerances of tests/support/checkpoint_state.h.

Run by ctest (tests/ray/ray.cmake) with the Ray venv's python; $SHARDLINE_BINARY is the binary
under test and $SHARDLINE_SOURCE_DIR the tree. A test that cannot start Ray at all exits 77
(ctest's SKIP_RETURN_CODE), saying why; anything else that goes wrong fails it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Optional

SKIP = 77


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def binary() -> str:
    path = os.environ.get("SHARDLINE_BINARY", "")
    if not os.access(path, os.X_OK):
        raise SystemExit(f"$SHARDLINE_BINARY ({path!r}) is not the shardline binary")
    return path


def source_dir() -> str:
    return os.environ.get("SHARDLINE_SOURCE_DIR",
                          os.path.dirname(os.path.dirname(os.path.dirname(
                              os.path.abspath(__file__)))))


class Scratch:
    """The test's temp dir, and Ray's (RAY_TMPDIR, kept short: Ray's socket paths must fit in
    108 bytes). Every process Ray starts inherits RAY_TMPDIR, which is how leftovers are found."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="shardline-ray-test-")
        self.ray_tmp = tempfile.mkdtemp(prefix="slr-", dir="/tmp")
        # Ray on loopback only: Ray's own switch for a one-machine cluster (its default on macOS
        # and Windows) makes every address it picks 127.0.0.1, where `--node-ip-address
        # 127.0.0.1` alone is replaced by the outward interface's address.
        os.environ.update({
            "RAY_TMPDIR": self.ray_tmp,
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_DEDUP_LOGS": "0",
            # Ray's metrics and event exporters are of no use here and cost CPU on two cores.
            "RAY_enable_metrics_collection": "0",
            # `ray` and the `python` of `ray job submit -- python ...`: this venv's.
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
        })

    def ours(self) -> list[tuple[int, list[str]]]:
        """(pid, argv) of the live processes that carry this test's RAY_TMPDIR."""
        marker = f"RAY_TMPDIR={self.ray_tmp}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker not in f.read().split(b"\0"):
                        continue
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
                with open(f"/proc/{entry}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                        continue  # a zombie is dead; its parent reaps it
            except OSError:
                continue
            found.append((int(entry), argv))
        return found

    def shardline_processes(self, node_id: str = "") -> list[tuple[int, list[str]]]:
        """Ours that run the shardline binary (of one node, by its --node-id, if given)."""
        exe = os.path.realpath(binary())
        out = []
        for pid, argv in self.ours():
            if not argv or os.path.realpath(argv[0]) != exe:
                continue
            if node_id and node_id not in argv:
                continue
            out.append((pid, argv))
        return out

    def kill_leftovers(self) -> list[tuple[int, list[str]]]:
        """Kills (by pid) whatever of ours still runs and returns what that was."""
        left = self.ours()
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


def wait_for(what: str, check: Callable[[], Optional[object]], timeout_s: float,
             context: Callable[[], str] = lambda: "", every_s: float = 0.3):
    """check() until it returns something truthy; AssertionError naming `what` (and whatever
    context() says) at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}\n"
                                 + context())
        time.sleep(every_s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launcher:
    """`python -m shardline_ray ...` as a process, its output collected line by line."""

    def __init__(self, args: list[str], log_path: str, cwd: str):
        self.lines: list[str] = []
        self.log = open(log_path, "w", encoding="utf-8")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "shardline_ray", *args], cwd=cwd, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, bufsize=1)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            self.log.write(line)
            self.log.flush()

    def output(self) -> str:
        return "\n".join(self.lines)

    def find(self, prefix: str) -> Optional[str]:
        for line in list(self.lines):
            if prefix in line:
                return line
        return None

    def wait(self, timeout_s: float) -> int:
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"the launcher did not end within {timeout_s:g} s:\n"
                                 + self.output()[-4000:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()

    def watch_command(self) -> tuple[str, str]:
        """The coordinator's endpoint and the client keys, from the launcher's "watch it" line."""
        line = wait_for("the launcher's coordinator line",
                        lambda: self.find("watch it: shardline status"), 120)
        words = line.split()
        return words[words.index("--coordinator") + 1], words[words.index("--keys") + 1]


def status(endpoint: str, keys: str, job: str = "") -> dict:
    argv = [binary(), "status", "--json", "--coordinator", endpoint, "--keys", keys]
    if job:
        argv.insert(2, job)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        return {}
    return json.loads(result.stdout)


# ---- checkpoints -----------------------------------------------------------------------------


def _shard_values(step_dir: str, shard: dict) -> list[float]:
    with open(os.path.join(step_dir, shard["file"]), "rb") as f:
        header_len = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(header_len))
        entry = header[shard["tensor"]]
        assert entry["dtype"] == "F32", entry
        begin, end = entry["data_offsets"]
        f.seek(8 + header_len + begin)
        data = f.read(end - begin)
    return list(struct.unpack(f"<{len(data) // 4}f", data))


def compare_checkpoints(got_step_dir: str, want_step_dir: str,
                        moments: bool = True) -> tuple[list[str], float]:
    """The differences past tests/support/checkpoint_state.h's tolerances between two steps of
    the same plan: parameters 1e-5 absolute, optimizer moments 1e-4 of their tensor's largest
    value (unless `moments` is False), the key third of qkv biases left out (it has no gradient,
    only rounding). Returns them (empty: the same state) and the moments' largest relative
    difference."""
    def manifest(d: str) -> dict:
        with open(os.path.join(d, "manifest.json"), encoding="utf-8") as f:
            return json.load(f)

    got, want = manifest(got_step_dir), manifest(want_step_dir)
    problems = []
    worst_moment = 0.0
    if set(got["tensors"]) != set(want["tensors"]):
        return [f"other tensors: {sorted(set(got['tensors']) ^ set(want['tensors']))}"], 0.0
    for name, tensor in want["tensors"].items():
        def values(d: str, t: dict) -> list[float]:
            out: list[float] = []
            for shard in sorted(t["shards"], key=lambda s: s["offsets"]):
                out += _shard_values(d, shard)
            return out

        g, w = values(got_step_dir, got["tensors"][name]), values(want_step_dir, tensor)
        if len(g) != len(w):
            problems.append(f"{name}: {len(g)} values, want {len(w)}")
            continue
        skip = range(len(w) // 3, 2 * len(w) // 3) if name.endswith("qkv.b") else range(0)
        largest = diff = 0.0
        for i, (a, b) in enumerate(zip(g, w)):
            if i in skip:
                continue
            largest = max(largest, abs(b))
            diff = max(diff, abs(a - b))
        moment = name.startswith("optim.")
        measure = diff / max(largest, 1e-30) if moment else diff
        if moment:
            worst_moment = max(worst_moment, measure)
            if not moments:
                continue
        if measure > (1e-4 if moment else 1e-5):
            kind = "relative" if moment else "absolute"
            problems.append(f"{name}: differs by {measure:.3g} ({kind})")
    return problems, worst_moment


def run_test(body: Callable[[Scratch], None]) -> None:
    """Runs one test body with its scratch dirs; whatever happens, leftovers are killed (and
    fail the test) and the dirs removed. Exits 0, 1, or 77 when Ray cannot start."""
    scratch = Scratch()
    code = 0
    try:
        body(scratch)
        log("PASSED")
    except RayUnavailable as e:
        log(f"SKIPPED: Ray cannot start here: {e}")
        code = SKIP
    except Exception:
        import traceback
        traceback.print_exc()
        log("FAILED")
        code = 1
    finally:
        # Ray's workers leave a moment after their raylet; a Shardline process must not stay.
        time.sleep(1)
        daemons = scratch.shardline_processes()
        left = scratch.kill_leftovers()
        if left:
            log("processes left behind (killed now):")
            for pid, argv in left:
                log(f"  {pid}: {' '.join(argv)[:160]}")
        if daemons:
            log("FAILED: Shardline processes outlived the test")
            code = code or 1
        if code == 1:
            log(f"kept for a look: {scratch.dir} (launcher logs, checkpoints) and "
                f"{scratch.ray_tmp} (Ray's and the daemons' logs: ray/session_*/logs/shardline)")
        else:
            scratch.remove()
    sys.stdout.flush()
    os._exit(code)


class RayUnavailable(RuntimeError):
    """Ray could not start at all on this machine: the one reason to skip."""
