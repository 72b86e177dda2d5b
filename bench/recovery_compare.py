#!/usr/bin/env python3
"""Shardline's elastic restart against torchrun's restart-all and TorchFT's healing, in one run.

The same GPT (2 layers, d_model 64, 4 heads, sequences of 32, a global batch of 8, byte
vocabulary), the same number of data-parallel workers (2, on one node), the same checkpoint
interval (5 steps); once the job has trained past interval + 2 steps, one worker (rank 1) is killed
with SIGKILL, and the time from the kill to the next completed training step is measured:

  - torchrun: `torchrun --nnodes=1:1 --nproc_per_node=2 --max_restarts=3 --rdzv-backend=c10d`
    running bench/recovery_torchrun_peer.py (DDP on Gloo, rank 0 saves model + optimizer every
    interval steps, every rank resumes from it). The agent sees the dead worker, stops the
    others and starts the whole group again. The time is that of the first step line the
    restarted group writes (restart >= 1, stamped by the worker) minus the kill's.
  - Shardline: a local coordinator and one agent (`--devices cpu:2`), an elastic train job
    (parallel {tp: 1, dp: 2}, elastic {min_actors: 2, max_actors: 2}). The time is that of the
    first `shardline status --json` (polled every 20 ms) showing generation 2 past its
    resumed_step, minus the kill's; a status call's own latency is printed beside it. The
    coordinator's recovery_seconds (fault to first step of the new generation) is printed too.
    Three sources of the state it resumes, each a system of its own here: `shardline` (the newest
    disk step), `shardline-memory` (checkpoint.memory_interval 1: every step in the nodes'
    memory) and `shardline-replica` (three agents of one device each; memory steps every step
    with memory_replicas 1; rank 1's agent is killed with its actors, its node lost, and the next
    generation takes that node's part, ZeRO-3 sharded, from its copy on another).
  - TorchFT (when the venv imports torchft, bench/setup-torchft.sh): one `torchft_lighthouse
    --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 1000` (--heartbeat_timeout_ms left at
    its default, 5000; both are options here) and --workers replica groups of one worker each,
    bench/recovery_torchft_peer.py (torchft.Manager on ProcessGroupGloo, torchft's
    DistributedDataParallel and OptimizerWrapper; no checkpoint file). Replica group 1 is killed
    and, once reaped, started again by this driver (as a scheduler would); it heals from the live
    group over TorchFT's checkpoint transport. Two times: kill -> the survivor's first step
    committed in a new quorum ("training continues"; the lighthouse only gives the survivor a
    quorum of its own once the dead group's heartbeat is older than the heartbeat timeout, or
    the restarted group joins), and kill -> the restarted group's first committed step ("back to
    full size"). Steps lost: the survivor's (it does not roll back: 0).

Steps lost: the last step the first generation completed minus the step the next one resumed
from (Shardline: generation 1's steps_lost; torchrun: its last restart-0 step minus the first
restarted step + 1). Either is between 0 and about one interval.

  bench/recovery_compare.py [BUILD_DIR] [--torch-venv /opt/shardline-bench/torch2] [--rounds 3]
      [--workers 2] [--interval 5] [--steps N] [--keep]
      [--only torchrun|shardline|shardline-memory|shardline-replica|torchft]
      [--torchft-join-timeout-ms 1000] [--torchft-heartbeat-timeout-ms 5000]

Prints each round, then per system the median and max over rounds, and
  result recovery shardline_median_s=... torchrun_median_s=... ratio=... steps_lost_shardline=...
      steps_lost_torchrun=... shardline_memory_median_s=... steps_lost_shardline_memory=...
      steps_lost_shardline_memory_max=... (the same for shardline_replica)
      [torchft_continue_median_s=... torchft_full_median_s=...
      steps_lost_torchft=... torchft=0.x] torch=2.x
ratio is torchrun's median over Shardline's (above 1: Shardline recovers faster). With
--only torchft: TorchFT's summary and a result line of its fields only.

After bench/setup-torch2.sh (and bench/setup-torchft.sh for TorchFT). Not part of ctest. Every
process it starts is in a process group of its own, killed at the end of its round, errors
included; it then checks that nothing is left.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)

MODEL = {"layers": 2, "d_model": 64, "heads": 4, "seq_len": 32, "batch": 8}


class BenchError(Exception):
    pass


class Processes:
    """Started processes, each the leader of its own process group."""

    def __init__(self):
        self.started = []

    def start(self, command, log_path, env=None, cwd=None):
        log = open(log_path, "ab")
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True)
        log.close()
        self.started.append(proc)
        return proc

    def kill_all(self):
        # torchrun starts each worker in a session of its own: kill the whole tree, by pid and by
        # process group, the leaders first so that nothing is started again meanwhile.
        tree = []
        for proc in self.started:
            tree += [proc.pid] + [pid for pid in descendants(proc.pid) if pid not in tree]
        for pid in tree:
            for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                try:
                    kill()
                except (ProcessLookupError, PermissionError):
                    pass
        for proc in self.started:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.started = []


def alive(pid):
    """Running, not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def processes_mentioning(token):
    """Live processes whose command line holds token (this one's excepted)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if token in cmdline and alive(int(entry)):
            found.append(f"{entry}: {cmdline[:160]}")
    return found


def parents():
    """{pid: parent pid} of every live (not zombie) process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] != "Z":
            table[int(entry)] = int(fields[1])
    return table


def children_of(pid):
    return [child for child, parent in parents().items() if parent == pid]


def descendants(pid):
    table = parents()
    found, frontier = [], [pid]
    while frontier:
        frontier = [child for child, parent in table.items() if parent in frontier]
        found += frontier
    return found


def env_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    except OSError:
        return {}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path, chars=3000):
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return f"(no {path})"
    return text[-chars:]


def wait_until(what, predicate, timeout, period=0.02, logs=()):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = "".join(f"\n--- {log}:\n{tail(log)}" for log in logs)
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(period)


# ---------------------------------------------------------------------------------------- torchrun

def read_steps(path):
    lines = []
    try:
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):
                    lines.append(json.loads(line))
    except FileNotFoundError:
        pass
    return lines


def torchrun_round(args, work, procs):
    run_dir = os.path.join(work, "torchrun")
    os.makedirs(run_dir)
    steps_path = os.path.join(run_dir, "steps.jsonl")
    log = os.path.join(work, "torchrun.log")
    # LOGLEVEL=INFO: the agent logs its restarts and rendezvous rounds with their times.
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", LOGLEVEL="INFO")
    command = [os.path.join(args.torch_venv, "bin", "torchrun"), "--nnodes=1:1",
               f"--nproc_per_node={args.workers}", "--max_restarts=3", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{free_port()}",
               os.path.join(HERE, "recovery_torchrun_peer.py"),
               "--layers", str(MODEL["layers"]), "--d-model", str(MODEL["d_model"]),
               "--heads", str(MODEL["heads"]), "--seq-len", str(MODEL["seq_len"]),
               "--batch", str(MODEL["batch"]), "--steps", str(args.steps),
               "--checkpoint-interval", str(args.interval), "--dir", run_dir]
    started = time.time()
    agent = procs.start(command, log, env=env)

    def step_lines():
        return [line for line in read_steps(steps_path) if "event" not in line]

    def trained():
        if agent.poll() is not None:
            raise BenchError(f"torchrun exited with {agent.returncode}:\n{tail(log)}")
        lines = step_lines()
        return lines and lines[-1]["step"] >= args.interval + 2

    wait_until(f"torchrun to train past step {args.interval + 2}", trained, 120, logs=[log])
    workers = children_of(agent.pid)
    ranks = {int(env_of(pid).get(b"RANK", b"-1")): pid for pid in workers}
    if 1 not in ranks:
        raise BenchError(f"no rank 1 among torchrun's children {workers}: {ranks}")
    victim = ranks[1]
    first_generation = [pid for pid in workers if pid != victim]
    kill_time = time.time()
    os.kill(victim, signal.SIGKILL)

    def restarted():
        if agent.poll() is not None:
            raise BenchError(f"torchrun exited with {agent.returncode}:\n{tail(log)}")
        return next((line for line in step_lines() if line["restart"] >= 1), None)

    try:
        first_new = wait_until("torchrun's restarted group to complete a step", restarted, 60)
    except BenchError as error:
        # Where the restarted workers are stuck: the peer dumps its stacks on SIGUSR1.
        workers = descendants(agent.pid)
        for pid in workers:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        time.sleep(1)
        raise BenchError(f"{error} (workers now: {workers})\n--- {log}:\n{tail(log, 6000)}")
    lines = step_lines()
    last_before = max(line["step"] for line in lines if line["restart"] == 0)
    resumed = first_new["step"] - 1
    leftovers = [pid for pid in first_generation if alive(pid)]
    return {
        "recovery_s": first_new["time"] - kill_time,
        "steps_lost": last_before - resumed,
        "detail": f"killed rank 1 (pid {victim}) after step {last_before}, resumed from step "
                  f"{resumed}, first step {first_new['step']} by pid {first_new['pid']} "
                  f"(startup to first step {lines[0]['time'] - started:.1f} s)",
        "problems": [f"generation-0 worker {pid} still alive after the restart"
                     for pid in leftovers],
    }


# --------------------------------------------------------------------------------------- Shardline

# Where a Shardline round resumes from, and how its fault is made:
#   disk:    one agent, rank 1 killed; the restart loads the newest disk step (every --interval).
#   memory:  the same with checkpoint.memory_interval 1: the nodes' memory holds every step.
#   replica: three agents of one device each (nodes of their own on this machine), ZeRO-3 (so
#            that a rank's memory step holds its own part only), memory steps every step with
#            memory_replicas 1; rank 1's agent is killed with its actors (its node lost) and the
#            next generation, on the two others, takes that node's part from its copy.
SHARDLINE_SOURCES = ("disk", "memory", "replica")


def shardline_round(args, work, procs, source="disk"):
    binary = os.path.join(args.build_dir, "cli", "shardline")
    endpoint_file = os.path.join(work, "endpoint")
    coordinator_log = os.path.join(work, "coordinator.log")
    agent_log = os.path.join(work, "agent.log")
    # The cluster's CURVE keys, as a real deployment has them (shardline keygen).
    keys = os.path.join(work, "keys")
    if not os.path.exists(os.path.join(keys, "allowlist")):
        subprocess.run([binary, "keygen", "--out", keys], check=True, stdout=subprocess.DEVNULL)
    curve = ["--keys", keys]
    coordinator = procs.start([binary, "coordinator", "--listen", "tcp://127.0.0.1:0",
                               "--endpoint-file", endpoint_file, "--state-dir",
                               os.path.join(work, "state"), "--metrics", "127.0.0.1:0"] + curve,
                              coordinator_log)

    def endpoint():
        if coordinator.poll() is not None:
            raise BenchError(f"coordinator exited with {coordinator.returncode}:\n"
                             f"{tail(coordinator_log)}")
        if os.path.exists(endpoint_file):
            with open(endpoint_file) as f:
                return f.read().strip()
        return None

    ep = wait_until("the coordinator's endpoint file", endpoint, 20, logs=[coordinator_log])
    # Host memory, as by default, in a folder of this round's own (removed with the round).
    memory_store = os.path.join("/dev/shm", os.path.basename(work) + "-memory")
    nodes = ["bench"] if source != "replica" else ["bench-a", "bench-b", "bench-c"]
    devices = f"cpu:{args.workers}" if source != "replica" else "cpu:1"
    agents = {}
    for node in nodes:
        agents[node] = procs.start(
            [binary, "agent", "--coordinator", ep, "--devices", devices, "--node-id", node,
             "--metrics", "127.0.0.1:0", "--log-dir", os.path.join(work, "actors"),
             "--memory-store", os.path.join(memory_store, node)] + curve,
            agent_log if node == nodes[0] else os.path.join(work, f"agent-{node}.log"))
    status_latency = []

    def status(job=None):
        command = [binary, "status"] + ([job] if job else []) + ["--coordinator", ep, "--json"] + curve
        began = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
        status_latency.append(time.monotonic() - began)
        if done.returncode != 0:
            return None
        try:
            return json.loads(done.stdout)
        except json.JSONDecodeError:
            return None

    def node_alive():
        for node, agent in agents.items():
            if agent.poll() is not None:
                raise BenchError(f"agent {node} exited with {agent.returncode}:\n"
                                 f"{tail(agent_log)}")
        s = status()
        return s and sum(n.get("state") == "alive" for n in s.get("nodes", [])) == len(nodes)

    wait_until("the agents to join", node_alive, 20, period=0.05,
               logs=[coordinator_log, agent_log])

    checkpoint_dir = os.path.join(work, "checkpoints")
    memory = {"disk": "", "memory": ", memory_interval: 1",
              "replica": ", memory_interval: 1, memory_replicas: 1"}[source]
    zero = ", zero: 3" if source == "replica" else ""
    spec = os.path.join(work, "job.yaml")
    with open(spec, "w") as f:
        f.write(f"""name: recovery-bench
kind: train
devices: cpu
bootstrap_timeout_s: 30
model: {{layers: {MODEL['layers']}, heads: {MODEL['heads']}, d_model: {MODEL['d_model']}, \
max_seq_len: {MODEL['seq_len']}}}
data: {{synthetic: {{seed: 2, bytes: 1MiB}}}}
optimizer: {{lr: 1.0e-3, weight_decay: 0.1}}
steps: {args.steps}
batch: {MODEL['batch']}
seq_len: {MODEL['seq_len']}
seed: 3
checkpoint: {{dir: {checkpoint_dir}, interval: {args.interval}{memory}}}
log_interval: 1
parallel: {{tp: 1, dp: {args.workers}{zero}}}
elastic: {{min_actors: {args.workers}, max_actors: {args.workers}}}
""")
    submitted = subprocess.run([binary, "submit", spec, "--coordinator", ep] + curve,
                               capture_output=True, text=True, timeout=30, cwd=work)
    if submitted.returncode != 0 or "submitted job " not in submitted.stdout:
        raise BenchError(f"submit failed ({submitted.returncode}): {submitted.stdout}"
                         f"{submitted.stderr}")
    job_id = submitted.stdout.split("submitted job ", 1)[1].split()[0]
    started = time.time()
    last = {}

    def job_state():
        s = status(job_id)
        if not s or not s.get("jobs"):
            return None
        job = s["jobs"][0]
        last["job"] = job
        if job["state"] in ("failed", "cancelled", "succeeded"):
            raise BenchError(f"job {job_id} {job['state']} early: {job.get('error')}\n"
                             f"{tail(coordinator_log)}")
        return job

    def trained():
        job = job_state()
        if not job or job["state"] != "running" or "train" not in job:
            return None
        pids = {a["rank"]: a["pid"] for a in job["actors"]}
        if job["train"]["step"] >= args.interval + 2 and pids.get(1, 0) > 0:
            return job
        return None

    job = wait_until(f"job {job_id} to train past step {args.interval + 2}", trained, 120,
                     logs=[coordinator_log, agent_log])
    to_step = time.time() - started
    pids = {a["rank"]: a["pid"] for a in job["actors"]}
    victim = pids[1]
    step_before = job["train"]["step"]
    if source == "replica":
        # Rank 1's node: its agent, and with it its actors.
        lost_node = next(a["node_id"] for a in job["actors"] if a["rank"] == 1)
        victim = agents[lost_node].pid
    kill_time = time.time()
    os.kill(victim, signal.SIGKILL)
    status_latency.clear()

    def recovered():
        job = job_state()
        if not job or job.get("generation", 0) < 2:
            return None
        generations = job["train"]["generations"]
        if len(generations) < 2:
            return None
        if job["train"]["step"] > generations[1]["resumed_step"]:
            return job, time.time()
        return None

    job, seen = wait_until("generation 2 to complete a step", recovered, 120,
                           logs=[coordinator_log, agent_log])
    latency = statistics.median(status_latency) if status_latency else float("nan")
    first, second = job["train"]["generations"][0], job["train"]["generations"][1]
    problems = []
    if source == "replica":
        if first.get("cause_kind") not in ("node_lost", "actor_exit", "comm_error"):
            problems.append(f"generation 1 ended with cause_kind {first.get('cause_kind')!r}, "
                            f"cause {first.get('cause')!r}")
    elif first.get("cause_kind") != "actor_exit" or "rank 1" not in first.get("cause", "") \
            or "SIGKILL" not in first.get("cause", ""):
        problems.append(f"generation 1 ended with cause_kind {first.get('cause_kind')!r}, "
                        f"cause {first.get('cause')!r}")
    expected_from = {"disk": "disk", "memory": "survivors", "replica": "memory replica"}[source]
    # The disk's step is taken when it is as new as the newest memory step (no note then).
    as_new_on_disk = second.get("resumed_from") == "disk" and not second.get("resume_note")
    if second.get("resumed_from") != expected_from and not as_new_on_disk:
        problems.append(f"generation 2 resumed from {second.get('resumed_from')!r}, not "
                        f"{expected_from!r} ({second.get('resume_note', '')})")
    if first.get("ending") != "fault":
        problems.append(f"generation 1 ending {first.get('ending')!r}, not 'fault'")
    if pids.get(0) and alive(pids[0]):
        problems.append(f"generation-1 rank 0 (pid {pids[0]}) still alive after the restart")
    if first["recovery_seconds"] > 2 * (seen - kill_time) + 1:
        problems.append(f"coordinator's recovery_seconds {first['recovery_seconds']:.3f} s "
                        f"exceeds the observed {seen - kill_time:.3f} s")
    # What generation 2's actors spent measuring before their first step, if they did.
    calibration = ""
    try:
        with open(os.path.join(work, "actors", f"{job_id}.g2.rank0.log")) as f:
            for line in f:
                if "calibration in " in line:
                    calibration = f"; generation 2 calibrated for {line.split('calibration in ')[1].split()[0]} s"
    except OSError:
        pass
    return {
        "recovery_s": seen - kill_time,
        "steps_lost": first["steps_lost"],
        "resumed_from": second.get("resumed_from"),
        "coordinator_recovery_s": first["recovery_seconds"],
        "abort_s": first.get("abort_seconds"),
        "detection_s": first.get("detection_seconds"),
        "status_latency_s": latency,
        "detail": f"killed rank 1 (pid {victim}) at status step {step_before}, generation 1 "
                  f"last_step {first['last_step']}, generation 2 resumed_step "
                  f"{second['resumed_step']} from {second.get('resumed_from')}; cause: "
                  f"{first.get('cause')!r} "
                  f"(submit to step {args.interval + 2}: {to_step:.1f} s){calibration}",
        "problems": problems,
    }


# ----------------------------------------------------------------------------------------- TorchFT

def wait_listening(port, what, timeout, proc, log):
    def up():
        if proc.poll() is not None:
            raise BenchError(f"{what} exited with {proc.returncode}:\n{tail(log)}")
        with socket.socket() as s:
            s.settimeout(0.2)
            return s.connect_ex(("127.0.0.1", port)) == 0
    wait_until(f"{what} to listen on port {port}", up, timeout, period=0.05, logs=[log])


def torchft_round(args, work, procs):
    run_dir = os.path.join(work, "torchft")
    os.makedirs(run_dir)
    steps_path = os.path.join(run_dir, "steps.jsonl")
    lighthouse_log = os.path.join(work, "lighthouse.log")
    lighthouse_port = free_port()
    with open(os.path.join(work, "lighthouse"), "w") as f:
        f.write(f"127.0.0.1:{lighthouse_port}")  # for the leftover check
    lighthouse = procs.start([os.path.join(args.torch_venv, "bin", "torchft_lighthouse"),
                              "--min_replicas", "1", "--quorum_tick_ms", "100",
                              "--join_timeout_ms", str(args.torchft_join_timeout_ms),
                              "--heartbeat_timeout_ms", str(args.torchft_heartbeat_timeout_ms),
                              "--bind", f"127.0.0.1:{lighthouse_port}"], lighthouse_log,
                             env=dict(os.environ, RUST_BACKTRACE="1"))
    wait_listening(lighthouse_port, "torchft_lighthouse", 20, lighthouse, lighthouse_log)
    groups = args.workers
    command = [os.path.join(args.torch_venv, "bin", "python"),
               os.path.join(HERE, "recovery_torchft_peer.py"),
               "--layers", str(MODEL["layers"]), "--d-model", str(MODEL["d_model"]),
               "--heads", str(MODEL["heads"]), "--seq-len", str(MODEL["seq_len"]),
               "--batch", str(MODEL["batch"]), "--steps", str(args.steps), "--dir", run_dir]

    def start_group(group, incarnation):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                   TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{lighthouse_port}",
                   REPLICA_GROUP_ID=str(group), NUM_REPLICA_GROUPS=str(groups),
                   INCARNATION=str(incarnation), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                   LOCAL_WORLD_SIZE="1")
        log = os.path.join(work, f"group{group}.{incarnation}.log")
        return procs.start(command, log, env=env), log

    started = time.time()
    members = {g: start_group(g, 0) for g in range(groups)}
    logs = [lighthouse_log] + [log for _, log in members.values()]

    def step_lines():
        return [line for line in read_steps(steps_path) if "event" not in line]

    def check_running():
        for name, proc, log in [("lighthouse", lighthouse, lighthouse_log)] + \
                [(f"replica group {g}", proc, log) for g, (proc, log) in members.items()]:
            if proc.poll() is not None:
                raise BenchError(f"{name} exited with {proc.returncode}:\n{tail(log)}")

    def trained():
        # With --min_replicas 1 the first group up trains alone until the other joins: wait for
        # both in one quorum, past the step.
        check_running()
        lines = step_lines()
        last = {}
        for x in lines:
            last[x["group"]] = x
        return len(last) == groups and all(
            x["participants"] == groups and x["step"] >= args.interval + 2 for x in last.values())

    wait_until(f"TorchFT's {groups} replica groups to train together past step "
               f"{args.interval + 2}", trained, 120, logs=logs)
    victim, _ = members[1]
    kill_time = time.time()
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)
    # The scheduler's part: start the dead group again at once (a fresh store port, as a new
    # torchelastic rendezvous would give it).
    restart_time = time.time()
    members[1] = start_group(1, 1)
    logs.append(members[1][1])
    before = [x for x in step_lines() if x["time"] <= kill_time]
    survivor_before = [x for x in before if x["group"] == 0]
    if not survivor_before:
        raise BenchError("replica group 0 logged no step before the kill")
    old_quorum = survivor_before[-1]["quorum_id"]
    last_before = survivor_before[-1]["step"]
    victim_last = max(x["step"] for x in before if x["group"] == 1)

    def continued():
        check_running()
        return next((x for x in step_lines() if x["group"] == 0 and x["time"] > kill_time
                     and x["quorum_id"] != old_quorum), None)

    def full():
        check_running()
        return next((x for x in step_lines() if x["group"] == 1 and x["incarnation"] >= 1), None)

    try:
        cont = wait_until("TorchFT's surviving group to commit a step in a new quorum", continued,
                          60, logs=logs)
        back = wait_until("TorchFT's restarted group to commit a step", full, 90, logs=logs)
    except BenchError as error:
        for proc, _ in members.values():
            try:
                os.kill(proc.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        time.sleep(1)
        raise BenchError(f"{error}\n" + "".join(f"\n--- {log}:\n{tail(log, 4000)}"
                                                 for log in logs))
    lines = read_steps(steps_path)
    first_any = next((x for x in lines if "event" not in x and x["group"] == 0
                      and x["time"] > kill_time), None)
    skipped = [x for x in lines if x.get("event") == "skipped" and x["group"] == 0
               and kill_time < x["time"] <= cont["time"]]
    survivor_at_back = max(x["step"] for x in lines if "event" not in x and x["group"] == 0
                           and x["time"] <= back["time"])
    problems = []
    if not back.get("healed") and back["step"] <= 1:
        problems.append(f"the restarted group's first step {back['step']} did not heal")
    return {
        "recovery_s": cont["time"] - kill_time,
        "full_s": back["time"] - kill_time,
        "steps_lost": max(0, last_before - (cont["step"] - 1)),
        "detail": f"killed replica group 1 (pid {victim.pid}) after its step {victim_last}; "
                  f"survivor's last step before the kill {last_before}, first step after it "
                  f"{first_any['step']} "
                  f"(+{first_any['time'] - kill_time:.3f} s, quorum {first_any['quorum_id']})"
                  f", first in a new quorum {cont['step']} (quorum {cont['quorum_id']} of "
                  f"{cont.get('quorum_size')} group(s)), {len(skipped)} uncommitted attempt(s) between; "
                  f"restarted group started {restart_time - kill_time:.3f} s after the kill, "
                  f"healed to and committed step {back['step']} in quorum {back['quorum_id']} of "
                  f"{back.get('quorum_size')} group(s) (survivor then at {survivor_at_back}) "
                  f"(startup to first step {min(x['time'] for x in step_lines()) - started:.1f} s)",
        "problems": problems,
    }


# ------------------------------------------------------------------------------------------ driver

def run_round(name, function, args, round_index):
    work = tempfile.mkdtemp(prefix=f"shardline-recovery-{name}-{round_index}-")
    procs = Processes()
    try:
        result = function(args, work, procs)
    except (BenchError, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as error:
        result = {"error": f"{type(error).__name__}: {error}"}
        args_keep, args.keep = args.keep, True  # a failed round keeps its logs
    else:
        args_keep = args.keep
    finally:
        procs.kill_all()
        time.sleep(0.3)
        left = processes_mentioning(work)
        if name == "shardline":
            # Actors' command lines hold the coordinator's endpoint, not the work dir.
            try:
                with open(os.path.join(work, "endpoint")) as f:
                    left += processes_mentioning(f.read().strip())
            except OSError:
                pass
        if name == "torchft":
            try:
                with open(os.path.join(work, "lighthouse")) as f:
                    left += processes_mentioning(f.read().strip())
            except OSError:
                pass
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        # A Shardline round's memory stores (host memory: never kept).
        shutil.rmtree(os.path.join("/dev/shm", os.path.basename(work) + "-memory"),
                      ignore_errors=True)
    result.setdefault("problems", [])
    if left:
        result["problems"].append("processes left after cleanup: " + "; ".join(left))
    if args.keep:
        result["problems"].append(f"(kept {work})")
    args.keep = args_keep
    return result


def torch_version(venv):
    done = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                           "import torch; print(torch.__version__)"],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        sys.exit(f"no torch in {venv} (run bench/setup-torch2.sh): {done.stderr.strip()}")
    return done.stdout.strip()


def torchft_version(venv):
    done = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                           "import importlib.metadata as m, torchft; print(m.version('torchft'))"],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not os.access(os.path.join(venv, "bin", "torchft_lighthouse"),
                                             os.X_OK):
        return None
    return done.stdout.strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build_dir", nargs="?", default=os.path.join(SOURCE, "build-dev"))
    parser.add_argument("--torch-venv", default="/opt/shardline-bench/torch2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--interval", type=int, default=5, help="checkpoint interval, steps")
    parser.add_argument("--steps", type=int, default=6000,
                        help="steps of each job (it is killed once recovered; enough to run "
                             "about a minute)")
    parser.add_argument("--keep", action="store_true", help="keep each round's temp dir")
    parser.add_argument("--only", choices=["torchrun", "shardline", "shardline-memory",
                                           "shardline-replica", "torchft"],
                        help="run one system only")
    parser.add_argument("--torchft-join-timeout-ms", type=int, default=1000,
                        help="torchft_lighthouse --join_timeout_ms")
    parser.add_argument("--torchft-heartbeat-timeout-ms", type=int, default=5000,
                        help="torchft_lighthouse --heartbeat_timeout_ms (its default)")
    args = parser.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)
    if (args.only is None or args.only.startswith("shardline")) and \
            not os.access(os.path.join(args.build_dir, "cli", "shardline"), os.X_OK):
        sys.exit(f"no shardline binary in {args.build_dir}/cli")
    torch = torch_version(args.torch_venv)
    torchft = torchft_version(args.torch_venv)
    if torchft is None:
        if args.only == "torchft":
            sys.exit(f"no torchft in {args.torch_venv} (run bench/setup-torchft.sh)")
        print(f"recovery: no torchft in {args.torch_venv} (bench/setup-torchft.sh): TorchFT "
              f"skipped", flush=True)
    print(f"recovery: GPT layers={MODEL['layers']} d_model={MODEL['d_model']} "
          f"heads={MODEL['heads']} seq_len={MODEL['seq_len']} batch={MODEL['batch']}, "
          f"{args.workers} data-parallel workers, checkpoint every {args.interval} steps, "
          f"rank 1 killed by SIGKILL past step {args.interval + 2}; torch {torch}"
          + (f", torchft {torchft} (2 replica groups of 1 worker, lighthouse --join_timeout_ms "
             f"{args.torchft_join_timeout_ms} --heartbeat_timeout_ms "
             f"{args.torchft_heartbeat_timeout_ms}; replica group 1 killed and restarted)"
             if torchft else ""), flush=True)

    systems = [("torchrun", torchrun_round), ("shardline", shardline_round),
               ("shardline-memory", lambda a, w, p: shardline_round(a, w, p, "memory")),
               ("shardline-replica", lambda a, w, p: shardline_round(a, w, p, "replica"))]
    if torchft:
        systems.append(("torchft", torchft_round))
    results = {name: [] for name, _ in systems}
    problems = []
    for r in range(1, args.rounds + 1):
        for name, function in systems:
            if args.only and name != args.only:
                continue
            result = run_round(name, function, args, r)
            if "error" in result:
                print(f"round {r} {name}: FAILED {result['error']}", flush=True)
            elif name == "torchft":
                results[name].append(result)
                print(f"round {r} torchft: kill -> survivor's next step {result['recovery_s']:.3f}"
                      f" s (training continues), kill -> restarted group's first step "
                      f"{result['full_s']:.3f} s (back to full size), steps lost "
                      f"{result['steps_lost']}; {result['detail']}", flush=True)
            else:
                results[name].append(result)
                extra = ""
                if name.startswith("shardline"):
                    detection = result["detection_s"]
                    extra = (f", coordinator recovery_seconds {result['coordinator_recovery_s']:.3f}"
                             + (f" (detection {detection:.3f})" if detection is not None and
                                detection >= 0 else "")
                             + f", abort {result['abort_s']:.3f}, one status call "
                             f"{result['status_latency_s']:.3f} s")
                print(f"round {r} {name}: kill -> next step {result['recovery_s']:.3f} s, steps lost "
                      f"{result['steps_lost']}{extra}; {result['detail']}", flush=True)
            for problem in result.get("problems", []):
                print(f"round {r} {name}: problem: {problem}", flush=True)
                problems.append(f"{name} round {r}: {problem}")

    def torchft_summary():
        if not results["torchft"]:
            print(f"\nTorchFT (torchft {torchft}): no round succeeded")
            return None
        cont = [x["recovery_s"] for x in results["torchft"]]
        full = [x["full_s"] for x in results["torchft"]]
        lost = [x["steps_lost"] for x in results["torchft"]]
        print(f"\nTorchFT replica-group healing (torchft {torchft}, torch {torch}): kill -> "
              f"survivor's next step median {statistics.median(cont):.3f} s, max {max(cont):.3f} "
              f"s; kill -> restarted group's first step median {statistics.median(full):.3f} s, "
              f"max {max(full):.3f} s over {len(cont)} rounds; steps lost median "
              f"{statistics.median(lost):g}, max {max(lost)}")
        return statistics.median(cont), statistics.median(full), statistics.median(lost)

    if args.only:
        if args.only == "torchft":
            ft = torchft_summary()
            if ft:
                print(f"result recovery torchft_continue_median_s={ft[0]:.3f} "
                      f"torchft_full_median_s={ft[1]:.3f} steps_lost_torchft={ft[2]:g} "
                      f"torchft={torchft} torch={torch}")
        return
    if not results["torchrun"] or not results["shardline"]:
        sys.exit("recovery: no round of one of the systems succeeded")

    def summary(name):
        times = [x["recovery_s"] for x in results[name]]
        lost = [x["steps_lost"] for x in results[name]]
        return statistics.median(times), max(times), statistics.median(lost), max(lost)

    ours, theirs = summary("shardline"), summary("torchrun")
    sources = {}  # Shardline's restart by where it resumed from
    for name, label in (("shardline", "from disk"), ("shardline-memory", "from memory"),
                        ("shardline-replica", "from a memory replica (node lost)")):
        if not results[name]:
            continue
        sources[name] = summary(name)
        coord = [x["coordinator_recovery_s"] for x in results[name]]
        print(f"\nShardline elastic restart {label}: kill -> next step median "
              f"{sources[name][0]:.3f} s, max {sources[name][1]:.3f} s over {len(results[name])} "
              f"rounds (coordinator's recovery_seconds median {statistics.median(coord):.3f} s, "
              f"max {max(coord):.3f} s); steps lost median {sources[name][2]:g}, max "
              f"{sources[name][3]}")
    print(f"torchrun restart-all (torch {torch}): kill -> next step median {theirs[0]:.3f} s, max "
          f"{theirs[1]:.3f} s over {len(results['torchrun'])} rounds; steps lost median "
          f"{theirs[2]:g}, max {theirs[3]}")
    ratio = theirs[0] / ours[0] if ours[0] > 0 else float("inf")
    ft = torchft_summary() if torchft else None
    print(f"ratio (torchrun median / Shardline median): {ratio:.1f}x, against torch {torch}")
    # The lossless paths against both peers (targets: steps lost 0-1, >= 10x faster than both).
    for name in ("shardline-memory", "shardline-replica"):
        if name not in sources or sources[name][0] <= 0:
            continue
        over_ft = f", TorchFT's survivor {ft[0] / sources[name][0]:.1f}x (torchft {torchft})" \
            if ft else ""
        print(f"{name}: torchrun {theirs[0] / sources[name][0]:.1f}x{over_ft} slower; steps lost "
              f"max {sources[name][3]}")
    by_source = "".join(
        f"{name.replace('-', '_')}_median_s={sources[name][0]:.3f} "
        f"steps_lost_{name.replace('-', '_')}={sources[name][2]:g} "
        f"steps_lost_{name.replace('-', '_')}_max={sources[name][3]} "
        for name in ("shardline-memory", "shardline-replica") if name in sources)
    print(f"result recovery shardline_median_s={ours[0]:.3f} torchrun_median_s={theirs[0]:.3f} "
          f"ratio={ratio:.2f} steps_lost_shardline={ours[2]:g} steps_lost_torchrun={theirs[2]:g} "
          + by_source
          + (f"torchft_continue_median_s={ft[0]:.3f} torchft_full_median_s={ft[1]:.3f} "
             f"steps_lost_torchft={ft[2]:g} torchft={torchft} " if ft else "")
          + f"torch={torch}")
    if problems:
        print(f"{len(problems)} problem(s) seen; see the round lines above")


if __name__ == "__main__":
    main()
