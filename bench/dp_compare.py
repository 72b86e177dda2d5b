#!/usr/bin/env python3
"""Shardline dp=2 against PyTorch DDP dp=2 (Gloo), the same GPT and batch, in one run.

  bench/dp_compare.py [BUILD_DIR] [--rounds 3] [--steps 5] [--ddp-warmup 2]
      [--python /opt/shardline-bench/torch2/bin/python] [--target 1.2] [--backend cpu|gloo]

BUILD_DIR defaults to build-dev beside bench/. Each round runs, one after the other:
  - Shardline: BUILD_DIR/bench/sharded_step_bench --steps N --threads 1 --layout 1x1x2
    --backend B (ZeRO 0, micro-batch 4: two forked ranks, one thread each, gradients
    all-reduced unit by unit on a communication thread; B = cpu, the default: the shared-memory
    backend CPU actors get; gloo: Gloo over loopback, as the peer);
  - PyTorch: `PYTHON -m torch.distributed.run --standalone --nnodes=1 --nproc_per_node=2
    bench/ddp_peer.py` (torchrun), DistributedDataParallel over Gloo on loopback, one thread per
    rank, fp32, with the model, global batch and micro-batch that sharded_step_bench printed.
PYTHON: --python, else the venv of bench/setup-torch2.sh (/opt/shardline-bench/torch2) when it
imports torch, else Debian's /usr/bin/python3 (python3-torch); the run says which torch it is.

Both sides' step time is the slowest rank's mean over the timed steps (sharded_step_bench's
"step ms"); the table gives the median over rounds, the ratio DDP ms / Shardline ms (above 1:
Shardline is faster) against the target, Shardline's communication share of the step (the
tensor-parallel collectives, the wait for the data-parallel reductions that the backward pass
did not hide, the gradient norm's all-reduce), and DDP's median step. Last line:
  result dp shardline_ms=... ddp_ms=... ratio=... target=1.2 met=yes|no torch=... comm_share=...
Not part of ctest. Needs ~2 free cores: anything else running skews both sides.
"""
import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import time

from tables import print_table  # bench/tables.py: this script's folder is on sys.path
from torch_peer import VENV_PYTHON, DEBIAN_PYTHON, pick_python

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)
# sharded_step_bench's layout table: {tp=1, pp=1, dp=2, micro_batch=4} (sequences per micro-batch
# on one data-parallel rank). Its model and global batch are read from its header line.
MICRO_BATCH = 4
DP = 2
HEADER = re.compile(r"^GPT layers=(\d+) d_model=(\d+) heads=(\d+) vocab=(\d+) seq=(\d+), "
                    r"global batch (\d+)")
DP_ROW = re.compile(r"^\s*1\s+1\s+2\s*\|\s*(\d+)\s+(\d+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|"
                    r"\s*([\d.]+)%\s+([\d.]+)%\s+([\d.]+)%(.*)$")


class BenchError(Exception):
    pass


def kill_group(proc):
    """Kills the process group `proc` leads (it and the ranks it forked) and reaps it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def shardline_round(bench, steps, timeout, backend):
    """Runs sharded_step_bench's dp=2 layout; returns (model, row, lines printed)."""
    command = [bench, "--steps", str(steps), "--threads", "1", "--layout", "1x1x2",
               "--backend", backend]
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, stdin=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"sharded_step_bench: no result after {timeout} s")
    lines = done.stdout.splitlines()
    model = row = None
    for line in lines:
        if (m := HEADER.match(line)) is not None:
            model = dict(zip(("layers", "d_model", "heads", "vocab", "seq", "batch"),
                             map(int, m.groups())))
        elif (m := DP_ROW.match(line)) is not None:
            row = {"world": int(m[1]), "threads": int(m[2]), "ms": float(m[3]),
                   "tokens_per_s": float(m[4]), "compute": float(m[5]), "comm": float(m[6]),
                   "bubble": float(m[7]), "note": m[8].strip()}
    if done.returncode != 0 or model is None or row is None:
        raise BenchError(f"sharded_step_bench exited with {done.returncode}, " +
                         ("no header" if model is None else "no dp=2 row" if row is None else "") +
                         ":\n" + "\n".join(lines))
    return model, row, lines


def ddp_round(python, torch_version, model, steps, warmup, timeout):
    command = [python, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
               f"--nproc_per_node={DP}"]
    if int(torch_version.split(".")[0]) < 2:
        # torch 1.13's torchrun on Python 3.11: the default "0" of --redirects/--tee parses to None
        # (enum iteration skips the zero flag) and the agent dies; 1 (stdout) parses. Rank output
        # then comes back prefixed "[default0]:".
        command += ["--redirects", "1", "--tee", "1"]
    command += [os.path.join(HERE, "ddp_peer.py"),
                "--layers", model["layers"], "--d-model", model["d_model"],
                "--heads", model["heads"], "--vocab", model["vocab"], "--seq", model["seq"],
                "--batch", model["batch"], "--micro-batch", MICRO_BATCH,
                "--steps", steps, "--warmup", warmup, "--threads", 1]
    command = [str(c) for c in command]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise BenchError(f"DDP peer: still running after {timeout} s")
    result = None
    for line in out.splitlines():
        at = line.find("RESULT impl=ddp ")
        if at >= 0:
            result = dict(kv.split("=", 1) for kv in line[at:].split()[1:])
    if result is None:
        raise BenchError(f"DDP peer exited with {proc.returncode}, no RESULT line: "
                         f"{' '.join(command)}\n{out}")
    if proc.returncode != 0:  # after its timed steps and RESULT: a teardown failure
        print(f"  (DDP peer exited with {proc.returncode} after its RESULT line; kept)", flush=True)
    config = next((l[l.find("config:"):] for l in out.splitlines() if "config:" in l), "")
    return {"ms": float(result["mean_ms"]), "median_ms": float(result["median_ms"]),
            "torch": result["torch"], "params": int(result["params"]),
            "loss": (result["loss_first"], result["loss_last"]), "config": config}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("build_dir", nargs="?", default=os.path.join(SOURCE, "build-dev"))
    p.add_argument("--rounds", type=int, default=3, help="runs of each side, alternating")
    p.add_argument("--steps", type=int, default=5,
                   help="timed steps on both sides (sharded_step_bench's default 5; it always "
                        "adds 1 warm-up step)")
    p.add_argument("--ddp-warmup", type=int, default=2,
                   help="DDP's untimed steps (2: its second iteration rebuilds the buckets)")
    p.add_argument("--python", default=None,
                   help=f"a Python with torch (default {VENV_PYTHON} if it imports torch, "
                        f"else {DEBIAN_PYTHON})")
    p.add_argument("--target", type=float, default=1.2, help="DDP ms / Shardline ms to reach")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per run of either side")
    p.add_argument("--backend", choices=("cpu", "gloo"), default="cpu",
                   help="Shardline's communicators: cpu (what CPU actors get: shared memory) or "
                        "gloo (Gloo over loopback, as the peer)")
    a = p.parse_args()

    bench = os.path.join(a.build_dir, "bench", "sharded_step_bench")
    if not os.access(bench, os.X_OK):
        sys.exit(f"dp_compare: {bench} not found; build it: ninja -C {a.build_dir} "
                 f"sharded_step_bench")
    python, torch_version, origin = pick_python(a.python, "dp_compare", need_gloo=True)
    print(f"# peer: PyTorch {torch_version} DDP over Gloo, {python} ({origin}); Shardline over "
          f"{'its CPU backend (shared memory)' if a.backend == 'cpu' else 'Gloo'}", flush=True)
    print(f"# dp={DP}, 1 thread per rank, {a.steps} timed steps (Shardline 1 warm-up, DDP "
          f"{a.ddp_warmup}), {a.rounds} rounds alternating; {os.cpu_count()} cores, load average "
          f"before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

    ours, theirs = [], []
    model = None
    try:
        for r in range(1, a.rounds + 1):
            start = time.perf_counter()
            model_r, row, lines = shardline_round(bench, a.steps, a.timeout, a.backend)
            if model is None:
                model = model_r
                print(f"# model: GPT layers={model['layers']} d_model={model['d_model']} "
                      f"heads={model['heads']} vocab={model['vocab']} seq={model['seq']}, global "
                      f"batch {model['batch']}, micro-batch {MICRO_BATCH} per rank "
                      f"({model['batch'] // (DP * MICRO_BATCH)} per rank per step)", flush=True)
            ours.append(row)
            print(f"  round {r} shardline {row['ms']:8.1f} ms/step  comm {row['comm']:.1f}%  "
                  f"compute {row['compute']:.1f}%  (process {time.perf_counter() - start:.0f} s; "
                  f"load {os.getloadavg()[0]:.2f})"
                  f"{'  ' + row['note'] if row['note'] else ''}", flush=True)
            start = time.perf_counter()
            res = ddp_round(python, torch_version, model, a.steps, a.ddp_warmup, a.timeout)
            theirs.append(res)
            print(f"  round {r} ddp       {res['ms']:8.1f} ms/step  median step "
                  f"{res['median_ms']:.1f} ms  loss {res['loss'][0]} -> {res['loss'][1]}  "
                  f"(process {time.perf_counter() - start:.0f} s; load "
                  f"{os.getloadavg()[0]:.2f})", flush=True)
    except BenchError as e:
        sys.exit(f"dp_compare: {e}")
    print(f"# DDP peer {theirs[0]['config']}")

    ms_ours = statistics.median(r["ms"] for r in ours)
    ms_theirs = statistics.median(r["ms"] for r in theirs)
    median_theirs = statistics.median(r["median_ms"] for r in theirs)
    comm = statistics.median(r["comm"] for r in ours)
    ratio = ms_theirs / ms_ours
    met = ratio >= a.target
    header = ["layout", f"Shardline ({a.backend}) ms/step", "DDP ms/step", "ratio (DDP/Shardline)", "torch",
              "target", "Shardline comm share"]
    row = [f"dp={DP} (tp=pp=1)", f"{ms_ours:.1f}", f"{ms_theirs:.1f}", f"{ratio:.2f}x",
           torch_version, f"{a.target:.2f}x {'met' if met else 'missed'}", f"{comm:.1f}%"]
    print()
    print_table(header, [row])
    print(f"(median of {a.rounds} rounds; ms/step = the slowest rank's mean over {a.steps} timed "
          f"steps on both sides; best round: Shardline {min(r['ms'] for r in ours):.1f}, DDP "
          f"{min(r['ms'] for r in theirs):.1f}; DDP's median step {median_theirs:.1f} ms)")
    print(f"result dp shardline_ms={ms_ours:.1f} ddp_ms={ms_theirs:.1f} ratio={ratio:.3f} "
          f"target={a.target:g} met={'yes' if met else 'no'} torch={torch_version} "
          f"comm_share={comm:.1f}% rounds={a.rounds} steps={a.steps} backend={a.backend}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
