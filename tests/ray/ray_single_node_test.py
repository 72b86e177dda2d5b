"""The user's command on a one-node Ray cluster: `ray start --head` on loopback, then

    ray job submit -- python -m shardline_ray examples/gpt-sharded.yaml

through Ray's job server. The job succeeds in the same state as `shardline up --job` of the same
spec (the same plan on the same devices: the same bits), its checkpoints land where relative
paths resolve for the driver (where Ray runs it: the head's working directory), and `ray job
stop` of a second, long job leaves no Shardline process and no key behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import ray_support as rs
from ray_support import log


def ray_cli(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    return subprocess.run([ray, *args], capture_output=True, text=True, timeout=timeout_s)


def start_head(scratch: rs.Scratch) -> tuple[subprocess.Popen, str]:
    """`ray start --head --block` in a session of its own (stopped by SIGTERM to it); returns it
    and its job server's address."""
    dashboard = rs.free_port()
    log_path = os.path.join(scratch.dir, "ray-head.log")
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    head = subprocess.Popen(
        [ray, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port",
         str(rs.free_port()), "--num-cpus", "4", "--num-gpus", "0", "--include-dashboard",
         "true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard),
         "--disable-usage-stats"],
        cwd=scratch.dir, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    address = f"http://127.0.0.1:{dashboard}"
    deadline = time.monotonic() + 90
    while ray_cli("job", "list", "--address", address).returncode != 0:
        if head.poll() is not None:
            with open(log_path) as f:
                raise rs.RayUnavailable(f"`ray start --head` exited {head.returncode}:\n"
                                        + f.read()[-3000:])
        if time.monotonic() > deadline:
            raise AssertionError("Ray's job server did not answer within 90 s")
        time.sleep(1)
    return head, address


def stop_head(head: subprocess.Popen) -> None:
    # `ray start --block` stops every process of its node on SIGTERM (never `ray stop`, which
    # would stop every Ray on this machine).
    head.send_signal(signal.SIGTERM)
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        head.kill()


def last_step_line(output: str) -> str:
    lines = re.findall(r"step 200/200  loss \S+", output)
    assert lines, output[-3000:]
    return lines[-1]


def body(scratch: rs.Scratch) -> None:
    started = time.monotonic()
    spec = os.path.join(rs.source_dir(), "examples", "gpt-sharded.yaml")

    # Without Ray first: `shardline up` of the same spec on 4 CPU devices.
    up_dir = os.path.join(scratch.dir, "up")
    os.mkdir(up_dir)
    up = subprocess.run([rs.binary(), "up", "--job", spec, "--devices", "4"], cwd=up_dir,
                        capture_output=True, text=True, timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    log(f"shardline up: {last_step_line(up.stdout)}")

    head, address = start_head(scratch)
    log(f"ray start --head: job server at {address} in {time.monotonic() - started:.1f} s")
    try:
        # ---- the user's command ---------------------------------------------------------
        t = time.monotonic()
        run = ray_cli("job", "submit", "--address", address, "--", "python", "-m",
                      "shardline_ray", spec, timeout_s=240)
        output = run.stdout + run.stderr
        with open(os.path.join(scratch.dir, "job-submit.log"), "w") as f:
            f.write(output)
        assert run.returncode == 0, output[-4000:]
        log(f"ray job submit: {last_step_line(output)} in {time.monotonic() - t:.1f} s")
        assert "Job gpt-sharded-1: succeeded" in output, output[-3000:]
        assert re.search(r"agent ray-\w+-0 at 127\.0\.0\.1: cpu:4", output), output[-3000:]
        assert "SUCCEEDED" in ray_cli("job", "list", "--address", address).stdout
        # The relative checkpoint dir resolved where the driver ran: the head's working dir.
        here = os.path.join(scratch.dir, "checkpoints", "gpt-sharded", "step-00000200")
        assert os.path.exists(os.path.join(here, "manifest.json")), os.listdir(scratch.dir)
        assert last_step_line(output) == last_step_line(up.stdout)
        problems, _ = rs.compare_checkpoints(
            here, os.path.join(up_dir, "checkpoints", "gpt-sharded", "step-00000200"))
        assert not problems, "\n".join(problems)
        assert not scratch.shardline_processes(), scratch.shardline_processes()

        # ---- `ray job stop` mid-run: everything goes --------------------------------------
        long_spec = os.path.join(scratch.dir, "long.yaml")
        with open(spec) as f:
            text = f.read()
        with open(long_spec, "w") as f:
            f.write(text.replace("name: gpt-sharded", "name: long").replace(
                "steps: 200", "steps: 100000").replace(
                "dir: checkpoints/gpt-sharded", "dir: checkpoints/long"))
        submitted = ray_cli("job", "submit", "--no-wait", "--address", address, "--", "python",
                            "-m", "shardline_ray", long_spec)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        job = re.search(r"raysubmit_\w+", submitted.stdout + submitted.stderr).group(0)

        def logs() -> str:
            return ray_cli("job", "logs", "--address", address, job).stdout

        rs.wait_for("the long job to train", lambda: re.search(r"step \d+/100000", logs()), 120,
                    logs)
        keys = re.search(r"--keys (\S+)", logs()).group(1)
        running = scratch.shardline_processes()
        # The coordinator, the agent and its 4 actors (and `shardline submit --wait`).
        assert len(running) >= 6 and os.path.isdir(keys), running
        t = time.monotonic()
        stopped = ray_cli("job", "stop", "--address", address, job, timeout_s=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        rs.wait_for("every Shardline process to end", lambda: not scratch.shardline_processes(),
                    30, lambda: str(scratch.shardline_processes()))
        log(f"ray job stop: no Shardline process left after {time.monotonic() - t:.1f} s")
        assert not os.path.exists(keys), f"{keys} outlived the job"
        said = ray_cli("job", "status", "--address", address, job)
        assert "was stopped" in said.stdout + said.stderr, said.stdout + said.stderr
        out = logs()
        assert "interrupted: cancelling the job and stopping the daemons" in out, out[-3000:]
        assert "cancelled job long-1" in out, out[-3000:]
    finally:
        stop_head(head)
    log(f"the whole test: {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    rs.run_test(body)
