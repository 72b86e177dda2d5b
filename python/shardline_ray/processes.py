"""The daemons' processes: started so that they die with whoever started them, and stopped in
order. Also the key files each daemon gets, written where only this user reads them."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import Mapping, Optional, Sequence

_PR_SET_PDEATHSIG = 1
# Resolved before any fork: the child of a multi-threaded Ray worker runs as little as it can
# between fork and exec.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def die_with(parent: int) -> None:
    """A preexec_fn: SIGKILL this child when the thread that forks it (in `parent`) exits. The
    parent may have died between fork and prctl, in which case we were reparented: exit."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def spawn(argv: Sequence[str], log_path: str, env: Optional[Mapping[str, str]] = None,
          cwd: Optional[str] = None) -> subprocess.Popen:
    """Starts `argv` with stdout and stderr to `log_path`; it gets SIGKILL when this process dies
    (a Ray actor killed with its node leaves no daemon behind: the agent's own actors die with it
    the same way). Call it from the main thread: PR_SET_PDEATHSIG follows the forking thread, and
    Ray runs an actor's methods on its main thread."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("spawn() must run on the main thread (PR_SET_PDEATHSIG follows it)")
    parent = os.getpid()
    merged = dict(os.environ)
    merged.update(env or {})
    with open(log_path, "ab", buffering=0) as log:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=merged, cwd=cwd,
                                preexec_fn=lambda: die_with(parent))


def stop(process: subprocess.Popen, grace_s: float = 10.0) -> Optional[int]:
    """SIGTERM (the daemons stop cleanly on it: an agent kills its actors first), then SIGKILL
    after `grace_s`. Returns the exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    return process.returncode


def tail(path: str, lines: int = 15) -> str:
    """The last `lines` lines of a log, indented, for an error message."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"    (no log at {path}: {e.strerror})"
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


def private_dir(prefix: str) -> str:
    """A new directory only this user can enter (mkdtemp makes it 0700), named after this
    process so that sweep_stale() can tell when its maker is gone."""
    sweep_stale(prefix)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")


def sweep_stale(prefix: str) -> None:
    """Removes this user's `prefix`PID-* dirs whose process is gone: what a SIGKILL (Ray's
    after `ray job stop`'s grace, or a lost node) left of a run's keys."""
    root = tempfile.gettempdir()
    try:
        entries = os.listdir(root)
    except OSError:
        return
    for name in entries:
        if not name.startswith(prefix):
            continue
        pid = name[len(prefix):].split("-", 1)[0]
        path = os.path.join(root, name)
        try:
            if not pid.isdigit() or os.stat(path).st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue


def write_keys(directory: str, files: Mapping[str, bytes]) -> str:
    """Writes key files (name -> bytes) into `directory`/keys, mode 0700/0600, and returns it."""
    keys = os.path.join(directory, "keys")
    os.mkdir(keys, 0o700)
    for name, data in files.items():
        if os.path.basename(name) != name:
            raise ValueError(f"not a key file name: {name!r}")
        fd = os.open(os.path.join(keys, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    return keys


def read_keys(directory: str, names: Sequence[str]) -> dict[str, bytes]:
    out = {}
    for name in names:
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = f.read()
    return out


def wait_for_file(path: str, process: subprocess.Popen, timeout_s: float, what: str,
                  log_path: str) -> str:
    """The contents of `path` once it exists (written whole by rename); an error naming `what`
    and its log's tail when the process exits first or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited (status {process.returncode}) before it listened:\n"
                               + tail(log_path))
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not start within {timeout_s:.0f} s:\n"
                               + tail(log_path))
        time.sleep(0.05)
    with open(path, encoding="utf-8") as f:
        return f.read().strip()
