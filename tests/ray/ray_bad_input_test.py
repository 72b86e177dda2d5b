"""Bad input: a Ray cluster with fewer devices than the job's minimum. examples/gpt-elastic.yaml
runs on 2 to 4 CPU devices; a one-node cluster of 1 CPU holds fewer. The launcher reserves what
the job needs at least, says what it waits for while Ray cannot give it, and at its deadline gives
up with that message (exit 1), leaving no placement group and no process behind. A spec it cannot
read fails before anything reaches Ray (exit 2); one that only Shardline's parser refuses fails
with its message (exit 1).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import ray_support as rs
from ray_support import log


def body(scratch: rs.Scratch) -> None:
    import ray
    from ray.cluster_utils import Cluster

    started = time.monotonic()
    # A spec with a typo'd file name: refused before Ray is asked anything.
    missing = subprocess.run(
        [sys.executable, "-m", "shardline_ray", os.path.join(scratch.dir, "nope.yaml")],
        capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2, missing
    assert "cannot read job spec" in missing.stderr, missing.stderr

    try:
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False})
    except Exception as e:  # noqa: BLE001 - whatever stops Ray from starting at all
        raise rs.RayUnavailable(f"{type(e).__name__}: {e}") from e
    log(f"Ray cluster of one node with 1 CPU up in {time.monotonic() - started:.1f} s")
    try:
        t = time.monotonic()
        launcher = rs.Launcher(
            [os.path.join(rs.source_dir(), "examples", "gpt-elastic.yaml"), "--address",
             cluster.address, "--placement-timeout-s", "6", "--work-dir", scratch.dir],
            os.path.join(scratch.dir, "launcher.log"), cwd=scratch.dir)
        code = launcher.wait(120)
        out = launcher.output()
        log(f"the launcher gave up in {time.monotonic() - t:.1f} s:\n{out}")
        assert code == 1, (code, out)
        assert ("the Ray cluster holds 1 of the job's 4 cpu devices: reserving 2 (elastic: "
                "min 2)") in out, out
        waiting = ("waiting for 2 bundles of {CPU: 1} (PACK), 2 CPU in all: the Ray cluster "
                   "has 1 CPU (1 free) on 1 node")
        assert f"shardline-ray: {waiting} (up to" in out, out
        assert f"error: {waiting}; gave up after 6 s (--placement-timeout-s)" in out, out
        assert "coordinator" not in out, out  # nothing was started

        # A spec that only Shardline's own parser refuses (heads must divide d_model): the
        # daemons start on the one device it asks for, `shardline submit` says what is wrong,
        # the launcher exits 1 and stops what it started.
        bad = os.path.join(scratch.dir, "bad.yaml")
        with open(bad, "w") as f:
            f.write("name: bad\nkind: train\n"
                    "model: {layers: 1, heads: 3, d_model: 64, max_seq_len: 16}\n"
                    "steps: 1\nbatch: 1\n")
        refused = rs.Launcher([bad, "--address", cluster.address, "--work-dir", scratch.dir],
                              os.path.join(scratch.dir, "bad.log"), cwd=scratch.dir)
        code = refused.wait(120)
        out = refused.output()
        log(f"a spec Shardline refuses:\n{out}")
        assert code == 1, (code, out)
        assert "error: " in out and "heads" in out, out
        assert not scratch.shardline_processes(), scratch.shardline_processes()
        # Nothing is left reserved.
        ray.init(address=cluster.address, logging_level="WARNING")
        groups = ray.util.placement_group_table()
        assert all(g["state"] == "REMOVED" for g in groups.values()), groups
        assert ray.available_resources().get("CPU") == 1, ray.available_resources()
        ray.shutdown()
    finally:
        cluster.shutdown()
    log(f"the whole test: {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    rs.run_test(body)
