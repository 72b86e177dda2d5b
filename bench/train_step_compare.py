#!/usr/bin/env python3
"""One GPT training step, Shardline against PyTorch, in the same run.

  bench/train_step_compare.py BUILD_DIR [--quick] [--rounds 2] [--threads 2] [--steps N]
      [--warmup N] [--batch N] [--vocab N] [--torch-python PYTHON]

Runs BUILD_DIR/bench/train_step_bench and bench/train_step_torch.py alternately, --rounds times
each, on the same model, batch, thread count and step counts, and prints a table of tokens/s (the
best round of each: the machine may be shared) and the ratio Shardline / PyTorch, the two sides'
losses step by step and whether they match, then the per-phase times of each side's best round.
PyTorch: --torch-python, else the PyTorch 2 venv of bench/setup-torch2.sh when present, else
Debian's python3-torch (bench/torch_peer.py); the run prints which. On the CPU both sides start
from the same state: the peer loads the initial parameters and batch Shardline wrote
(train_step_bench --init-out, train_step_torch.py --init-from).

--shape smollm: a Llama of SmolLM-135M's shape (30 layers, d_model 576, 9 heads over 3 key/value
heads, d_ff 1536, vocab 49152, tied; --quick: 4 layers, d_model 256) against a PyTorch Llama
(RMSNorm, rotary, SDPA with enable_gqa, SwiGLU).

Default: GPT-2 small (12 layers, d_model 768, 12 heads, seq 256, batch 4, vocab 50304), 2 threads,
warmup 1, steps 3 (several minutes). --quick: 4 layers, d_model 256, 4 heads, seq 128, batch 4
(about a minute).

--device cuda: BUILD_DIR/bench/train_step_gpu_bench against train_step_torch.py --device cuda on
GPU 0, both in --precision (default bf16: our bf16 GEMMs over fp32 master weights, PyTorch's
autocast), GPT-2 small at seq 1024, batch 16, warmup 3, steps 10; the table adds each side's MFU
(6·params·tokens/s over --peak-tflops, default 989.4: the H100/H200 SXM dense bf16 peak). Pass the
Python that has a CUDA torch with --torch-python (on the device machines: python3).
"""
import argparse
import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from tables import print_table  # bench/tables.py: this script's folder is on sys.path
from torch_peer import VENV_PYTHON, DEBIAN_PYTHON, pick_python

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("build_dir")
    p.add_argument("--quick", action="store_true", help="a small model, about a minute")
    p.add_argument("--shape", choices=["small", "medium", "smollm"], default="small",
                   help="GPT-2 small (12 layers, d_model 768) or medium (24, 1024), or a Llama "
                        "of SmolLM-135M's shape (30 layers, d_model 576, 9 heads over 3 "
                        "key/value heads, d_ff 1536, vocab 49152, tied)")
    p.add_argument("--rounds", type=int, default=2, help="runs of each side, alternating")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 3)")
    p.add_argument("--warmup", type=int, default=None, help="warmup steps (default 1)")
    p.add_argument("--batch", type=int, default=None, help="default 4")
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--torch-python", default=None,
                   help=f"a Python with torch (default: {VENV_PYTHON} of bench/setup-torch2.sh "
                        f"when it imports torch, else Debian's {DEBIAN_PYTHON})")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16",
                   help="with --device cuda: how the GEMMs compute, on both sides")
    p.add_argument("--peak-tflops", type=float, default=989.4,
                   help="with --device cuda: the GPU's dense peak for MFU")
    p.add_argument("--torch-no-foreach", action="store_true",
                   help="PyTorch's AdamW with its per-tensor loop (torch 1.13's CPU default)")
    return p.parse_args()


def run(cmd, env):
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout)
        sys.exit(f"train_step_compare: {' '.join(cmd)} exited with {proc.returncode}")
    result = phases = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = dict(kv.split("=", 1) for kv in line.split()[1:])
        elif line.startswith("PHASES "):
            phases = dict(kv.split("=", 1) for kv in line.split()[1:])
    if result is None:
        sys.stderr.write(proc.stdout)
        sys.exit(f"train_step_compare: no RESULT line from {' '.join(cmd)}")
    losses = re.findall(r"^loss: first (\S+) last (\S+)", proc.stdout, re.M)
    steps = [float(x) for x in re.findall(r"^step \d+(?: \(warmup\))?: loss (\S+)", proc.stdout,
                                          re.M)]
    return {"tokens_per_s": float(result["tokens_per_s"]), "step_s": float(result["step_s"]),
            "params": int(result.get("params", 0)),
            "peak_bytes": int(result["peak_bytes"]), "peak_kind": result.get("peak_kind", "?"),
            "phases": {k: float(v) for k, v in (phases or {}).items() if k != "impl"},
            "loss": losses[0] if losses else ("?", "?"), "step_losses": steps, "wall_s": wall}


def main():
    a = parse_args()
    cuda = a.device == "cuda"
    if a.quick:
        shape = dict(layers=4, d_model=256, heads=4, seq=128, batch=4)
    elif cuda:
        shape = dict(layers=12, d_model=768, heads=12, seq=1024, batch=16)
    else:
        shape = dict(layers=12, d_model=768, heads=12, seq=256, batch=4)
    if a.shape == "medium" and not a.quick:
        shape.update(layers=24, d_model=1024, heads=16)
    llama = a.shape == "smollm"
    if llama:
        shape.update(layers=30, d_model=576, heads=9, kv_heads=3, d_ff=1536)
        if a.quick:
            shape.update(layers=4, d_model=256, heads=4, kv_heads=2, d_ff=688)
        if a.vocab == 50304:
            a.vocab = 49152
    if a.batch is not None:
        shape["batch"] = a.batch
    steps = a.steps if a.steps is not None else (10 if cuda else 3)
    warmup = a.warmup if a.warmup is not None else (3 if cuda else 1)

    a.torch_python, torch_version, origin = pick_python(a.torch_python, "train_step_compare")
    name = "train_step_gpu_bench" if cuda else "train_step_bench"
    bench = os.path.join(a.build_dir, "bench", name)
    if not os.access(bench, os.X_OK):
        sys.exit(f"train_step_compare: {bench} not found; build it: "
                 f"ninja -C {a.build_dir} {name}")
    common = ["--layers", shape["layers"], "--d-model", shape["d_model"], "--heads", shape["heads"],
              "--seq", shape["seq"], "--batch", shape["batch"], "--vocab", a.vocab,
              "--steps", steps, "--warmup", warmup]
    if llama:
        common += ["--llama", 1, "--kv-heads", shape["kv_heads"], "--d-ff", shape["d_ff"]]
    common = [str(x) for x in common]
    if cuda:
        ours_cmd = [bench] + common + ["--precision", a.precision,
                                       "--peak-tflops", str(a.peak_tflops)]
        torch_cmd = [a.torch_python, os.path.join(HERE, "train_step_torch.py")] + common + [
            "--device", "cuda", "--precision", a.precision]
    else:
        ours_cmd = [bench] + common + ["--threads", str(a.threads)]
        torch_cmd = [a.torch_python, os.path.join(HERE, "train_step_torch.py")] + common + [
            "--threads", str(a.threads)]
    if a.torch_no_foreach:
        torch_cmd.append("--no-foreach")
    if not cuda:
        # Both sides start from one state: Shardline's initial parameters and batch, which the
        # peer loads, so that the losses can be compared step by step.
        init_dir = tempfile.mkdtemp(prefix="train_step_compare_")
        atexit.register(shutil.rmtree, init_dir, True)
        ours_cmd += ["--init-out", init_dir]
        torch_cmd += ["--init-from", init_dir]

    print(f"# peer: PyTorch {torch_version} ({origin}): {a.torch_python}", flush=True)
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(a.threads)
    env["OPENBLAS_NUM_THREADS"] = str(a.threads)

    config = (f"{'Llama ' if llama else ''}L{shape['layers']} C{shape['d_model']} "
              f"H{shape['heads']}{'/KV' + str(shape['kv_heads']) if llama else ''} "
              f"T{shape['seq']} B{shape['batch']} V{a.vocab}")
    where = f"cuda, {a.precision}" if cuda else f"threads {a.threads}"
    print(f"# {config}, {where}, warmup {warmup}, steps {steps}, "
          f"{a.rounds} rounds each, alternating; load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    runs = {"shardline": [], "pytorch": []}
    for r in range(a.rounds):
        for impl, cmd in (("shardline", ours_cmd), ("pytorch", torch_cmd)):
            res = run(cmd, env)
            runs[impl].append(res)
            print(f"  round {r + 1} {impl:<9} {res['tokens_per_s']:10.1f} tokens/s  "
                  f"step {res['step_s']:.3f} s  loss {res['loss'][0]} -> {res['loss'][1]}  "
                  f"(process {res['wall_s']:.1f} s; load "
                  f"{os.getloadavg()[0]:.2f})", flush=True)

    best = {k: max(v, key=lambda x: x["tokens_per_s"]) for k, v in runs.items()}
    ours, theirs = best["shardline"], best["pytorch"]
    header = ["config", "device" if cuda else "threads", "tokens/s Shardline", "tokens/s PyTorch",
              "ratio"]
    row = [config, f"cuda {a.precision}" if cuda else str(a.threads),
           f"{ours['tokens_per_s']:.1f}", f"{theirs['tokens_per_s']:.1f}",
           f"{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x"]
    if cuda:
        def mfu(res):
            return 6.0 * res["params"] * res["tokens_per_s"] / (a.peak_tflops * 1e12)
        header += ["MFU Shardline", "MFU PyTorch"]
        row += [f"{100 * mfu(ours):.1f}%", f"{100 * mfu(theirs):.1f}%"]
    print()
    print_table(header, [row])
    print(f"(best of {a.rounds} rounds each; ratio = Shardline / PyTorch, higher is better; "
          f"peak: Shardline allocator {ours['peak_bytes'] / 2**20:.0f} MiB, "
          f"PyTorch {'allocator' if cuda else 'process max RSS'} "
          f"{theirs['peak_bytes'] / 2**20:.0f} MiB)")

    # The same initial state and batch: the losses should agree to fp32 rounding (kernels sum in
    # different orders), step after step, within 1e-3 relative.
    ls, lt = runs["shardline"][0]["step_losses"], runs["pytorch"][0]["step_losses"]
    if cuda:
        print("losses: each side's own initialisation on cuda (not compared)")
    elif ls and len(ls) == len(lt):
        worst = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(ls, lt))
        print(f"losses from the same initial state and batch, step by step (round 1): Shardline "
              f"{' '.join(f'{x:.4f}' for x in ls)}; PyTorch {' '.join(f'{x:.4f}' for x in lt)}: "
              f"{'match' if worst <= 1e-3 else 'DIFFER'} (largest relative difference "
              f"{worst:.1e})")
    else:
        print(f"losses: not comparable (Shardline {len(ls)} steps, PyTorch {len(lt)})")
    print(f"peer: PyTorch {torch_version} ({origin})")

    print()
    for impl in ("shardline", "pytorch"):
        res = best[impl]
        total = res["step_s"]
        if not res["phases"]:  # Shardline's engine times its step whole (--kernels splits it)
            continue
        parts = "  ".join(f"{k} {v:.3f}s ({100 * v / total:.0f}%)" for k, v in res["phases"].items())
        print(f"phases {impl}: {parts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
