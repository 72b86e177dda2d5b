#!/usr/bin/env python3
"""The torchrun peer of bench/recovery_compare.py: DDP on Gloo, restart-all from a checkpoint.

One worker of `torchrun --nproc_per_node=W --max_restarts=N`: a GPT of Shardline's shape (GPT-2
blocks, byte vocabulary of 257, tied head, learned positions; as bench/train_step_torch.py) trained
data-parallel with DistributedDataParallel over Gloo, one thread per worker. --batch is the global
batch (as Shardline's `batch:`), split evenly over the ranks; synthetic random tokens.

Rank 0 saves model + optimizer + step every --checkpoint-interval steps (torch.save to a temporary
file, then an atomic rename); every rank resumes from that file at start, which is all torchrun's
restart-all has to go on: when a worker dies, the agent stops the others and starts the whole group
again (TORCHELASTIC_RESTART_COUNT counts the restarts).

Rank 0 appends one JSON line per completed step to DIR/steps.jsonl:
  {"rank", "step", "time" (time.time()), "restart", "pid"}
and one {"event": "resumed", "step", ...} line when it starts from a checkpoint.

  torchrun ... bench/recovery_torchrun_peer.py --layers 2 --d-model 64 --heads 4 --seq-len 32
      --batch 8 --steps N --checkpoint-interval 5 --dir DIR
"""
import argparse
import faulthandler
import json
import math
import os
import signal
import time

# Before torch loads: its OpenMP pool reads this.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

VOCAB = 257  # Shardline's byte tokenizer: 256 bytes + end-of-text


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln1 = nn.LayerNorm(C, eps=1e-5)
        self.qkv = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C, eps=1e-5)
        self.fc = nn.Linear(C, 4 * C)
        self.fc_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.H
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, hs).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, C, H, V, T):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, H) for _ in range(layers)])
        self.lnf = nn.LayerNorm(C, eps=1e-5)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p) if name.endswith(("ln1.weight", "ln2.weight", "lnf.weight")) \
                    else nn.init.zeros_(p)
            else:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(
                    ("attn_proj.weight", "fc_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.lnf(x))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--batch", type=int, default=8, help="global batch, split over the ranks")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--checkpoint-interval", type=int, default=5)
    p.add_argument("--dir", required=True)
    args = p.parse_args()

    # The driver sends SIGUSR1 to a group that does not get going: every thread's stack to stderr.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    micro = max(1, args.batch // world)

    torch.manual_seed(1337)
    model = GPT(args.layers, args.d_model, args.heads, VOCAB, args.seq_len)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)

    os.makedirs(args.dir, exist_ok=True)
    ckpt = os.path.join(args.dir, "checkpoint.pt")
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt, map_location="cpu")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = int(state["step"])
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters
    dist.barrier()  # every rank has read the file before rank 0 may replace it

    log = open(os.path.join(args.dir, "steps.jsonl"), "a", buffering=1) if rank == 0 else None
    if log and start:
        log.write(json.dumps({"event": "resumed", "rank": rank, "step": start,
                              "time": time.time(), "restart": restart,
                              "pid": os.getpid()}) + "\n")

    for step in range(start + 1, args.steps + 1):
        g = torch.Generator().manual_seed(step * 1009 + rank)
        tokens = torch.randint(0, VOCAB, (micro, args.seq_len), generator=g)
        targets = torch.roll(tokens, shifts=-1, dims=1)
        opt.zero_grad(set_to_none=True)
        logits = ddp(tokens)
        loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if rank == 0 and step % args.checkpoint_interval == 0:
            tmp = ckpt + f".tmp{os.getpid()}"
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "step": step}, tmp)
            os.replace(tmp, ckpt)
        if log:
            log.write(json.dumps({"rank": rank, "step": step, "time": time.time(),
                                  "restart": restart, "pid": os.getpid()}) + "\n")
    if log:
        log.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
