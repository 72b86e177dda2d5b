#!/usr/bin/env python3
"""The PyTorch DDP peer of Shardline's dp=2 training step (bench/dp_compare.py).

One worker of `torchrun --standalone --nnodes=1 --nproc_per_node=2`, as DDP users run it on one
machine: DistributedDataParallel over Gloo (TCP on loopback, GLOO_SOCKET_IFNAME=lo unless set, as
Shardline's forked ranks), one thread per rank, fp32. The model is bench/train_step_torch.py's GPT
(imported from that file, not copied: GPT-2 blocks, learned positions, final LayerNorm, head tied
to wte, GPT-2 initialisation) with a forward() over its embed/blocks/head.

The step is sharded_step_bench's dp=2 layout (tp=pp=1, ZeRO 0): --batch is the global batch over
all ranks, each rank runs its batch/world sequences as micro-batches of --micro-batch, gradient
accumulation with DDP's no_sync() on every micro-batch but the last (whose backward all-reduces
the buckets, overlapped with the rest of the backward pass), each micro-batch loss divided by the
number of micro-batches (the mean over the global batch, as ShardedGpt's loss), then
clip_grad_norm_(1.0) and AdamW (lr 1e-4, betas 0.9/0.999, eps 1e-8, weight decay 0: what
sharded_step_bench's ShardedOptions default to; foreach, PyTorch's fastest CPU AdamW). Timed:
zero_grad through opt.step(), per rank, no barrier (ranks meet in the all-reduce anyway); the
random token batches of every step are drawn before the first step.

Defaults: the issue's reference model of sharded_step_bench (8 layers, d_model 256, 8 heads, vocab
257, seq 128, global batch 16, micro-batch 4). --warmup defaults to 2: DDP rebuilds its buckets in
the order gradients arrived at the start of the second iteration, so that one is not steady state.

  [python -m] torchrun --standalone --nnodes=1 --nproc_per_node=2 bench/ddp_peer.py
      [--layers 8] [--d-model 256] [--heads 8] [--seq 128] [--vocab 257] [--batch 16]
      [--micro-batch 4] [--steps 5] [--warmup 2] [--threads 1]

Rank 0 prints one line per step and at the end, machine-readable:
  RESULT impl=ddp torch=VERSION backend=gloo world=2 threads=1 median_ms=... mean_ms=...
      min_ms=... max_ms=... steps=... params=... loss_first=... loss_last=...
median_ms: the median over timed steps of the slowest rank's time of that step; mean_ms: the
slowest rank's mean over timed steps (how sharded_step_bench reports its "step ms").
"""
import argparse
import contextlib
import importlib.util
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=257)
    p.add_argument("--batch", type=int, default=16, help="global batch over all ranks")
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per micro-batch per rank")
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--threads", type=int, default=1, help="threads per rank")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--foreach", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--bucket-cap-mb", type=float, default=None, help="default: DDP's (25)")
    return p.parse_args()


args = parse_args()
# Before torch loads: its OpenMP pool and the BLAS read these.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def load_train_step_torch(threads):
    """bench/train_step_torch.py as a module (it parses its own argv when loaded)."""
    spec = importlib.util.spec_from_file_location("train_step_torch",
                                                  os.path.join(HERE, "train_step_torch.py"))
    module = importlib.util.module_from_spec(spec)
    argv = sys.argv
    sys.argv = [spec.origin, "--threads", str(threads)]
    try:
        spec.loader.exec_module(module)
    finally:
        sys.argv = argv
    return module


peer = load_train_step_torch(args.threads)
torch = peer.torch
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


class GPT(peer.GPT):
    def forward(self, idx):
        return self.head(self.blocks(self.embed(idx)))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(args.threads)
    B, T, V, mb = args.batch, args.seq, args.vocab, args.micro_batch
    if B % (world * mb) != 0:
        sys.exit(f"ddp_peer: global batch {B} is not divisible by micro_batch·world = {mb * world}")
    per_rank = B // world
    micro_batches = per_rank // mb

    torch.manual_seed(1337)  # the same init on every rank (DDP broadcasts rank 0's anyway)
    model = GPT(args.layers, args.d_model, args.heads, V, T)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())  # wte once (tied)
    # The causal mask buffer is a constant, the same on every rank (and unused under SDPA): not
    # state to broadcast at construction and before every synced forward (torch 1.13's Gloo also
    # cannot broadcast a bool tensor: "Invalid scalar type").
    DDP._set_params_and_buffers_to_ignore_for_model(model, ["mask"])
    ddp_kw = {} if args.bucket_cap_mb is None else {"bucket_cap_mb": args.bucket_cap_mb}
    ddp = DDP(model, **ddp_kw)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.999), eps=1e-8, foreach=args.foreach)

    # Every step's global batch up front; this rank keeps its contiguous share (as FirstSample).
    g = torch.Generator().manual_seed(42)
    batches = []
    for _ in range(args.warmup + args.steps):
        tokens = torch.randint(0, V, (B, T), generator=g)
        targets = torch.roll(tokens, shifts=-1, dims=1)
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        batches.append((tokens[mine].split(mb), targets[mine].split(mb)))

    if rank == 0:
        print(f"config: layers={args.layers} heads={args.heads} d_model={args.d_model} vocab={V} "
              f"seq={T} global_batch={B} world={world} micro_batch={mb} "
              f"micro_batches_per_rank={micro_batches} params={n_params} "
              f"threads={torch.get_num_threads()} torch={torch.__version__} backend=gloo "
              f"GLOO_SOCKET_IFNAME={os.environ.get('GLOO_SOCKET_IFNAME')} "
              f"attention={'sdpa' if peer.HAVE_SDPA else 'manual_softmax'} foreach={args.foreach}",
              flush=True)

    times, losses = [], []
    for step in range(args.warmup + args.steps):
        inputs, targets = batches[step]
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for i in range(micro_batches):
            sync = i == micro_batches - 1
            with contextlib.nullcontext() if sync else ddp.no_sync():
                logits = ddp(inputs[i])
                loss = F.cross_entropy(logits.view(-1, V), targets[i].reshape(-1)) / micro_batches
                loss.backward()
            loss_sum += loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        seconds = time.perf_counter() - start
        if step >= args.warmup:
            times.append(seconds)
        losses.append(float(loss_sum))  # this rank's half of the batch
        if rank == 0:
            print(f"step {step + 1}{' (warmup)' if step < args.warmup else ''}: "
                  f"loss (rank 0 share) {losses[-1]:.4f} grad_norm {float(norm):.4f} {1e3 * seconds:.1f} ms",
                  flush=True)

    everyone = [None] * world
    dist.all_gather_object(everyone, times)
    if rank == 0:
        slowest_per_step = [max(r[i] for r in everyone) for i in range(args.steps)]
        slowest_mean = max(statistics.mean(r) for r in everyone)
        per_rank_means = " ".join(f"{1e3 * statistics.mean(r):.1f}" for r in everyone)
        print(f"per-rank mean ms: {per_rank_means}")
        print(f"RESULT impl=ddp torch={torch.__version__} backend=gloo world={world} "
              f"threads={args.threads} median_ms={1e3 * statistics.median(slowest_per_step):.3f} "
              f"mean_ms={1e3 * slowest_mean:.3f} min_ms={1e3 * min(slowest_per_step):.3f} "
              f"max_ms={1e3 * max(slowest_per_step):.3f} steps={args.steps} params={n_params} "
              f"loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f}", flush=True)
    # Every rank past rank 0's printing before the teardown: torch 2.15's Gloo process group
    # destroyed while the peer still talks to it aborts ("terminate called without an active
    # exception") after the result is out.
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
