#!/usr/bin/env python3
"""The TorchFT peer of bench/recovery_compare.py: one replica group, healed from a live peer.

One replica group of one worker, started by the driver once per group (as a scheduler would): the
same GPT and synthetic data as bench/recovery_torchrun_peer.py (its model code is imported), data
parallel across replica groups through torchft: a torchft.Manager (ProcessGroupGloo, min_replica_size
1, async quorum, the lighthouse at $TORCHFT_LIGHTHOUSE), the gradients flattened into one buffer and
averaged over the groups in the quorum by Manager.allreduce, and torchft.optim.OptimizerWrapper (the
optimizer steps only when the manager commits). Not torchft.DistributedDataParallel: in torchft
0.2.0 its comm hook fails `assert fut._fut` (an AssertionError out of backward) when the allreduce
fails because a peer died, so the survivor would die with it; Manager.allreduce's wait() reports
that error to the manager instead, as intended. --batch is the global batch, split over
NUM_REPLICA_GROUPS; the data of step s for group g is seeded s * 1009 + g, as the torchrun peer's
rank g.

There is no checkpoint file: when a group dies the others go on in a smaller quorum; a group started
again joins the next quorum, is behind (step 0), and heals: the manager fetches model + optimizer +
step from a live group over TorchFT's HTTP checkpoint transport, then trains on with the others.

The group's rank-0 TCPStore (which the Manager expects to exist, as torchelastic would provide) is
created here at MASTER_ADDR:MASTER_PORT. Environment:
  TORCHFT_LIGHTHOUSE   http://HOST:PORT of torchft_lighthouse
  REPLICA_GROUP_ID     0, 1, ...;  NUM_REPLICA_GROUPS  2
  MASTER_ADDR, MASTER_PORT  this group's store;  INCARNATION  how often the driver restarted it

Appends one JSON line per committed step to DIR/steps.jsonl:
  {"group", "step" (the manager's step after the commit), "time" (time.time()), "incarnation",
   "pid", "participants" (replica groups at the quorum's max step: a group still healing is not
   one), "quorum_size" (replica groups in the quorum's process group), "quorum_id", "healed" (this
   incarnation healed before or at this step)}
and {"event": "skipped", ...} for a step the manager did not commit (a failed allreduce).

  REPLICA_GROUP_ID=0 NUM_REPLICA_GROUPS=2 ... bench/recovery_torchft_peer.py --layers 2
      --d-model 64 --heads 4 --seq-len 32 --batch 8 --steps N --dir DIR
"""
import argparse
import faulthandler
import json
import logging
import os
import signal
import sys
import time
from datetime import timedelta

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from recovery_torchrun_peer import GPT, VOCAB  # noqa: E402
from torchft import Manager, ProcessGroupGloo  # noqa: E402
from torchft.optim import OptimizerWrapper  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--batch", type=int, default=8, help="global batch, split over the groups")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--timeout-s", type=float, default=10.0,
                   help="the manager's timeout (collectives, should_commit, healing)")
    p.add_argument("--dir", required=True)
    args = p.parse_args()

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    torch.set_num_threads(1)
    group = int(os.environ["REPLICA_GROUP_ID"])
    groups = int(os.environ.get("NUM_REPLICA_GROUPS", 2))
    incarnation = int(os.environ.get("INCARNATION", 0))
    micro = max(1, args.batch // groups)

    store = dist.TCPStore(host_name=os.environ["MASTER_ADDR"], port=int(os.environ["MASTER_PORT"]),
                          is_master=True, wait_for_workers=False)

    torch.manual_seed(1337)
    model = GPT(args.layers, args.d_model, args.heads, VOCAB, args.seq_len)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    inner = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=1e-3, betas=(0.9, 0.95), eps=1e-8)

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    timeout = timedelta(seconds=args.timeout_s)
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1,
                      load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=f"recovery_bench_{group}", rank=0, world_size=1,
                      store_addr=os.environ["MASTER_ADDR"],
                      store_port=int(os.environ["MASTER_PORT"]), hostname="127.0.0.1",
                      timeout=timeout)
    opt = OptimizerWrapper(manager, inner)
    params = list(model.parameters())  # the tied head once

    os.makedirs(args.dir, exist_ok=True)
    log = open(os.path.join(args.dir, "steps.jsonl"), "a", buffering=1)
    healed = False

    def record(**fields):
        log.write(json.dumps(dict(fields, group=group, time=time.time(), incarnation=incarnation,
                                  pid=os.getpid())) + "\n")

    while manager.current_step() < args.steps:
        before = manager.current_step()
        opt.zero_grad(set_to_none=True)  # starts the quorum (async)
        step = before + 1
        g = torch.Generator().manual_seed(step * 1009 + group)
        tokens = torch.randint(0, VOCAB, (micro, args.seq_len), generator=g)
        targets = torch.roll(tokens, shifts=-1, dims=1)
        logits = model(tokens)
        loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
        loss.backward()
        # The manager's allreduce (an average over the quorum's participants; zeros from a group
        # still healing); a failed one is reported to the manager, which then does not commit.
        flat = torch.cat([q.grad.reshape(-1) for q in params])
        manager.allreduce(flat).wait()
        offset = 0
        for q in params:
            q.grad.copy_(flat[offset:offset + q.numel()].view_as(q.grad))
            offset += q.numel()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        healed = healed or manager._healing  # set by the quorum when this group heals
        opt.step()  # steps the optimizer only if the manager commits
        after = manager.current_step()
        try:
            quorum_size = manager._pg.size()  # replica groups in the process group
        except Exception:  # noqa: BLE001 (not configured: the quorum failed)
            quorum_size = None
        fields = {"participants": manager.num_participants(), "quorum_size": quorum_size,
                  "quorum_id": getattr(manager, "_quorum_id", None), "healed": healed}
        if after > before:
            record(step=after, **fields)
        else:
            record(event="skipped", step=before, **fields)
    log.close()
    manager.shutdown(wait=False)
    del store


if __name__ == "__main__":
    main()
