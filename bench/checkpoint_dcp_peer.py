#!/usr/bin/env python3
"""The peer of bench/checkpoint_bench: PyTorch 2's distributed checkpoint (torch.distributed.checkpoint,
DCP), saving on 2 ranks the state a tensor-parallel rank of GPT-2 small holds (its half of every
split matrix, the replicated tensors on rank 0 only, each parameter with both AdamW moments; the
same tensors and bytes as Shardline's rank files), synchronously (dcp.save) and asynchronously
(dcp.async_save, whose return is the training loop's stall), alternated in fresh folders.

Run with the PyTorch 2 of bench/setup-torch2.sh (not Debian's 1.13, which has no async_save):

  /opt/shardline-bench/torch2/bin/python bench/checkpoint_dcp_peer.py [--dir /tmp] [--rounds 5]

Prints one line per round and a final `result` line of medians (parsed by
bench/checkpoint_compare.py). Not part of ctest.
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

# GPT-2 small, as bench/checkpoint_bench trains it: tied embeddings, tp = 2.
LAYERS, D_MODEL, VOCAB, MAX_SEQ = 12, 768, 50257, 1024
TP = 2


def rank_state(rank):
    """The tensors one tensor-parallel rank writes: per parameter, its box and both moments."""
    C, F = D_MODEL, 4 * D_MODEL
    v0, v1 = VOCAB * rank // TP, VOCAB * (rank + 1) // TP
    shapes = {"wte": (v1 - v0, C)}
    if rank == 0:  # tensor-parallel replicas are written by rank 0 only
        shapes["wpe"] = (MAX_SEQ, C)
        shapes["lnf.w"] = (C,)
        shapes["lnf.b"] = (C,)
    for layer in range(LAYERS):
        h = f"h.{layer}."
        shapes[h + "qkv.w"] = (3, C // TP, C)
        shapes[h + "qkv.b"] = (3, C // TP)
        shapes[h + "attn_proj.w"] = (C, C // TP)
        shapes[h + "fc.w"] = (F // TP, C)
        shapes[h + "fc.b"] = (F // TP,)
        shapes[h + "fc_proj.w"] = (C, F // TP)
        if rank == 0:
            for name in ("ln1.w", "ln1.b", "ln2.w", "ln2.b", "attn_proj.b", "fc_proj.b"):
                shapes[h + name] = (C,)
    generator = torch.Generator().manual_seed(rank)
    state = {}
    for name, shape in shapes.items():
        for prefix in ("", "optim.exp_avg.", "optim.exp_avg_sq."):
            state[prefix + name] = torch.randn(shape, generator=generator)
    return state


def rank_main(rank, args, port, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=TP)
    state = rank_state(rank)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    rows = []
    for r in range(args.rounds):
        # Alternate which goes first, so that neither always inherits the other's writeback.
        order = ("sync", "async") if r % 2 == 0 else ("async", "sync")
        row = {}
        for kind in order:
            path = os.path.join(args.dir, f"{kind}-{r}")
            dist.barrier()
            start = time.monotonic()
            if kind == "sync":
                dcp.save(state, checkpoint_id=path)
                stall = time.monotonic() - start
                done = stall
            else:
                response = dcp.async_save(state, checkpoint_id=path)
                stall = time.monotonic() - start
                future = getattr(response, "upload_completion", response)
                future.result()
                done = time.monotonic() - start
            times = torch.tensor([stall, done], dtype=torch.float64)
            dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the slowest rank's
            total = torch.tensor([float(nbytes)], dtype=torch.float64)
            dist.all_reduce(total)
            row[kind] = (times[0].item(), times[1].item(), total.item())
            dist.barrier()
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
        rows.append(row)
    if rank == 0:
        results.put(rows)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--port", type=int, default=29533)
    args = parser.parse_args()
    args.dir = tempfile.mkdtemp(prefix="shardline_dcp_peer.", dir=args.dir)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    try:
        mp.start_processes(rank_main, args=(args, args.port, results), nprocs=TP, join=False,
                           start_method="spawn")
        rows = results.get(timeout=3600)
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    print(f"peer: torch {torch.__version__} torch.distributed.checkpoint, {TP} ranks (gloo), "
          f"1 thread each, FileSystemWriter defaults (fsync on)")
    print("round | save s  GB/s | async_save stall s  done s  GB/s")
    sync_s, async_stall, async_done = [], [], []
    for r, row in enumerate(rows):
        s_stall, _, nbytes = row["sync"]
        a_stall, a_done, _ = row["async"]
        sync_s.append(s_stall)
        async_stall.append(a_stall)
        async_done.append(a_done)
        print(f"{r + 1:5d} | {s_stall:6.3f} {nbytes / s_stall / 1e9:5.2f} | {a_stall:18.3f} "
              f"{a_done:7.3f} {nbytes / a_done / 1e9:5.2f}")
    nbytes = rows[0]["sync"][2]
    print(f"result torch={torch.__version__} bytes={nbytes:.0f} "
          f"save_s={statistics.median(sync_s):.4f} "
          f"async_stall_s={statistics.median(async_stall):.4f} "
          f"async_done_s={statistics.median(async_done):.4f}")


if __name__ == "__main__":
    main()
