"""An elastic job on a Ray cluster of three nodes (Ray's own multi-node test cluster,
ray.cluster_utils.Cluster, every node on 127.0.0.1) loses a node mid-training and gets it back:

  - the fault-free run of the same spec first, through the same launcher;
  - then the elastic run: after its first committed checkpoint one worker node is removed
    (cluster.remove_node SIGKILLs its raylet, whose workers then end: the agent's actor, and
    with it the agent and its actor, by PR_SET_PDEATHSIG); the job goes on with dp 2 on the two
    nodes left;
  - a node is added: Ray re-places the lost bundle there and restarts the agent's actor, whose
    agent registers and the job grows back to dp 3 at its next commit;
  - the job succeeds with the fault-free run's loss and final state (the tolerances of
    tests/support/checkpoint_state.h), `shardline status` lists the generations, and no Shardline
    process outlives the test.
"""

from __future__ import annotations

import json
import os
import time

import ray_support as rs
from ray_support import log

STEPS = 800


def spec(name: str) -> str:
    # 4 layers of d_model 128 on 3 ranks of one thread, 12 sequences a step: ~0.04-0.1 s a step on
    # 2 cores, so the job outlasts a node's removal and return (5-15 s) with room (6 sequences
    # a step, 0.019 s on a 2-core Zen 5, once ended before the node was back). A small lr keeps
    # the fp32 rounding of the plans it switches between (dp 3, 2, 3) inside the equivalence
    # tolerance (Adam turns a rounding-sized gradient into an lr-sized step): measured without Ray
    # (`shardline up`), 400 of 800 steps on dp 2 left the parameters within 1e-5 and the moments
    # within 1.1e-5 of dp 3 throughout at lr 1e-4, but 1.3e-5 and 5e-3 at lr 3e-4; at lr 3e-3
    # the run is chaotic (80 steps on dp 2: loss 0.61 at step 600 where dp 3 alone had 0.68).
    return f"""name: {name}
kind: train
devices: cpu
model: {{layers: 4, heads: 4, d_model: 128, max_seq_len: 64}}
data: {{synthetic: {{seed: 1, bytes: 256KiB}}}}
optimizer: {{lr: 1.0e-4, warmup_steps: 10, weight_decay: 0.0, grad_clip: 1.0}}
steps: {STEPS}
batch: 12
micro_batch: 1
seq_len: 64
seed: 1
checkpoint: {{dir: checkpoints/{name}, interval: 20, keep: 2}}
log_interval: 10
parallel: {{tp: 1, pp: 1, dp: 3}}
elastic: {{min_actors: 1, max_actors: 3, progress_timeout_s: 20}}
"""


def body(scratch: rs.Scratch) -> None:
    from ray.cluster_utils import Cluster

    for name in ("reference", "elastic"):
        with open(os.path.join(scratch.dir, f"{name}.yaml"), "w") as f:
            f.write(spec(f"ray-{name}"))
    started = time.monotonic()
    try:
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "node_ip_address": "127.0.0.1", "include_dashboard": False})
        workers = [cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1") for _ in range(3)]
        cluster.wait_for_nodes(timeout=60)
    except Exception as e:  # noqa: BLE001 - whatever stops Ray from starting at all
        raise rs.RayUnavailable(f"{type(e).__name__}: {e}") from e
    log(f"Ray cluster of a head and 3 nodes up in {time.monotonic() - started:.1f} s")
    launchers: list[rs.Launcher] = []

    def launch(name: str) -> rs.Launcher:
        launcher = rs.Launcher(
            [os.path.join(scratch.dir, f"{name}.yaml"), "--address", cluster.address,
             "--strategy", "SPREAD", "--work-dir", scratch.dir, "--timeout-s", "400",
             "--result-json", os.path.join(scratch.dir, f"{name}.json")],
            os.path.join(scratch.dir, f"{name}.log"), cwd=scratch.dir)
        launchers.append(launcher)
        return launcher

    try:
        # ---- the fault-free run -------------------------------------------------------------
        t = time.monotonic()
        reference = launch("reference")
        code = reference.wait(300)
        assert code == 0, f"the fault-free run ended {code}:\n{reference.output()}"
        with open(os.path.join(scratch.dir, "reference.json")) as f:
            want = json.load(f)
        log(f"fault-free run: {want['train']['generations'][0]['plan']}, "
            f"loss {want['train']['loss']!r} in {time.monotonic() - t:.1f} s")
        assert len(want["train"]["generations"]) == 1, want["train"]["generations"]

        # ---- the elastic run: a node lost and back --------------------------------------------
        t = time.monotonic()
        elastic = launch("elastic")
        endpoint, keys = elastic.watch_command()

        def job() -> dict:
            got = rs.status(endpoint, keys, "ray-elastic-1")
            return got["jobs"][0] if got.get("jobs") else {}

        def training_past(step: int):
            j = job()
            train = j.get("train") or {}
            return j if (j.get("phase") == "running" and
                         train.get("last_committed_step", -1) >= step) else None

        running = rs.wait_for("the job to train past its first commit",
                              lambda: training_past(20), 120,
                              lambda: elastic.output()[-3000:])
        assert running["world_size"] == 3, running
        # The worker node of rank 1's agent ("ray-<Ray node id prefix>-<bundle>").
        victim_id = next(a["node_id"] for a in running["actors"] if a["rank"] == 1)
        prefix = victim_id.split("-")[1]
        victim = next(n for n in workers if n.node_id.startswith(prefix))
        doomed = scratch.shardline_processes(victim_id)
        assert len(doomed) == 2, f"want the agent and its actor of {victim_id}: {doomed}"
        log(f"removing Ray node {victim.node_id[:8]} (agent {victim_id}) at step "
            f"{running['train']['step']}")
        cluster.remove_node(victim, allow_graceful=False)  # SIGKILL, as a crash
        rs.wait_for(f"{victim_id}'s agent and actor to die with the node",
                    lambda: not scratch.shardline_processes(victim_id), 15)

        smaller = rs.wait_for(
            "the job to go on with dp 2 on the nodes left",
            lambda: (lambda j: j if j.get("generation", 0) >= 2 and j.get("phase") == "running"
                     and j.get("world_size") == 2 else None)(job()), 90)
        lost = smaller["train"]["generations"][0]
        log(f"generation 1 ended by: {lost['cause']} ({lost['cause_kind']}); "
            f"running on {smaller['world_size']} at step {smaller['train']['step']}")
        assert lost["ending"] == "fault", lost

        log("adding a Ray node back")
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        larger = rs.wait_for(
            "the job to grow back to dp 3",
            lambda: (lambda j: j if j.get("world_size") == 3 and j.get("generation", 0) >= 3
                     or j.get("state") not in (None, "pending", "running") else None)(job()),
            120, lambda: elastic.output()[-3000:])
        assert larger["state"] == "running", f"the job ended before it grew back: {larger}"
        log(f"grew back: generation {larger['generation']} at step {larger['train']['step']}")
        assert elastic.find("Ray restarted this actor"), elastic.output()

        code = elastic.wait(300)
        assert code == 0, f"the elastic run ended {code}:\n{elastic.output()}"
        log(f"elastic run done in {time.monotonic() - t:.1f} s")
        with open(os.path.join(scratch.dir, "elastic.json")) as f:
            got = json.load(f)
        assert got["state"] == "succeeded", got
        generations = got["train"]["generations"]
        for g in generations:
            log(f"  generation {g['generation']}: {g['plan']}, from step {g['resumed_step']} to "
                f"{g['last_step']}, {g['ending']}{': ' + g['cause'] if g['cause'] else ''}")
        assert len(generations) >= 3, generations
        assert "dp 2" in generations[1]["plan"] and generations[1]["ending"] == "grow", generations
        assert "dp 3" in generations[-1]["plan"], generations
        # The same loss as the fault-free run: the same global batch and sample order whatever
        # the plan; only the order of the gradients' fp32 sums differed while on dp 2.
        got_loss, want_loss = got["train"]["loss"], want["train"]["loss"]
        log(f"final loss {got_loss!r}, fault-free {want_loss!r} (difference "
            f"{abs(got_loss - want_loss):.3g})")
        assert abs(got_loss - want_loss) <= 1e-5 * abs(want_loss), (got_loss, want_loss)
        # And its state: parameters and Adam moments.
        problems, moments = rs.compare_checkpoints(
            os.path.join(scratch.dir, "checkpoints/ray-elastic", f"step-{STEPS:08d}"),
            os.path.join(scratch.dir, "checkpoints/ray-reference", f"step-{STEPS:08d}"))
        assert not problems, "\n".join(problems)
        log(f"the final state is the fault-free run's (Adam moments within {moments:.2g})")
        # `shardline status` listed the generations as they ended.
        assert "generation 1 " in elastic.output() and "generation 2 " in elastic.output()
    finally:
        for launcher in launchers:
            launcher.stop()
        t = time.monotonic()
        cluster.shutdown()
        log(f"Ray cluster shut down in {time.monotonic() - t:.1f} s")
    log(f"the whole test: {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    rs.run_test(body)
