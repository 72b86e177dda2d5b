#!/usr/bin/env python3
"""One rank of the PyTorch peers of bench/slow_link_compare.py: DDP, DDP + PowerSGD, TorchFT DiLoCo.

The driver starts one process per rank inside its host's network namespace
(`ip netns exec NS PYTHON bench/slow_link_peer.py ...`), as torchrun would on each host; nothing
here knows about namespaces or shaping. The model is bench/train_step_torch.py's GPT with
bench/ddp_peer.py's forward (both imported, not copied), fp32, --threads threads per rank.

Data: --corpus, a byte-level text file (token = byte, as Shardline's byte tokenizer; the driver
writes the file and gives the same one to Shardline's job). The global batch of step s is --batch
windows of seq + 1 bytes at offsets drawn from a generator seeded (--seed, s); rank r trains on
the contiguous slice r of it. So every mode and every layout sees the same tokens in the same
order; each step's gradient is the mean over the global batch.

Modes (--mode):
  ddp       DistributedDataParallel over Gloo across all ranks (world = hosts x ranks per host,
            MASTER_ADDR the first host), its default buckets (25 MB) overlapped with the backward.
  powersgd  the same with DDP's PowerSGD communication hook (torch.distributed.algorithms.
            ddp_comm_hooks.powerSGD_hook: error feedback and warm start on, the defaults), rank
            --powersgd-rank; --start-powersgd-iter (default 2, the smallest PyTorch accepts with
            error feedback) plain all-reduces before it; tensors that a rank-R factorisation
            would not shrink by PowerSGD's min_compression_rate (2) are all-reduced as they are.
  diloco    torchft.local_sgd.DiLoCo: one replica group per host (a "site"); inside a host the
            ranks are plain DDP on their own Gloo group over loopback (each rank's slice of the
            global batch, as above); across hosts a torchft.Manager (ProcessGroupGloo,
            synchronous quorum, min_replica_size = hosts, init_sync off as every replica starts
            from the same seeded weights, the lighthouse at --lighthouse) and
            DiLoCo every --every inner steps: the pseudo-gradient all-reduced, an outer
            SGD(lr --outer-lr, momentum --outer-momentum, nesterov) step. TorchFT reduces per
            local rank (local rank i of every group together), so with 2 ranks per host every
            rank sends the whole pseudo-gradient: twice the bytes of one exchange per host.
Inner/only optimizer everywhere: AdamW (lr --lr, betas 0.9/0.95, eps 1e-8, weight decay 0: the
values the driver also gives Shardline's job) after clipping the global gradient norm to 1.0.

Environment (set by the driver): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT (ddp/powersgd: the job's store on the first host; diloco: this host's group store),
GLOO_SOCKET_IFNAME; diloco also REPLICA_GROUP_ID, NUM_REPLICA_GROUPS.

Rank 0 prints `step S loss L` after every step (the driver follows it). Every rank writes
OUT/rank<R>.json at the end: {"rank", "mode", "torch", "torchft", "losses" (this rank's loss of
every step, on its slice), "ends" (time.time() at the end of every step), "start"}.

  ip netns exec NS env RANK=0 ... PYTHON bench/slow_link_peer.py --mode ddp --corpus FILE
      --out DIR [--layers 8 --d-model 256 --heads 8 --seq 128 --batch 16] [--steps 100]
"""
import argparse
import importlib.util
import json
import os
import sys
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=("ddp", "powersgd", "diloco"), required=True)
    p.add_argument("--corpus", required=True, help="byte-level text file")
    p.add_argument("--out", required=True, help="folder for rank<R>.json")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=257)
    p.add_argument("--batch", type=int, default=16, help="global batch over all ranks")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--start-powersgd-iter", type=int, default=2)
    p.add_argument("--every", type=int, default=50, help="DiLoCo's inner steps per sync (H)")
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--outer-momentum", type=float, default=0.9)
    p.add_argument("--lighthouse", default=None, help="diloco: http://HOST:PORT")
    p.add_argument("--timeout-s", type=float, default=600.0,
                   help="every collective, store and quorum wait")
    return p.parse_args()


args = parse_args()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)


def load_ddp_peer(threads):
    """bench/ddp_peer.py as a module, for its GPT (it parses its own argv when loaded)."""
    spec = importlib.util.spec_from_file_location("ddp_peer", os.path.join(HERE, "ddp_peer.py"))
    module = importlib.util.module_from_spec(spec)
    argv = sys.argv
    sys.argv = [spec.origin, "--threads", str(threads)]
    try:
        spec.loader.exec_module(module)
    finally:
        sys.argv = argv
    return module


ddp_peer = load_ddp_peer(args.threads)
torch = ddp_peer.torch
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def env_int(name):
    value = os.environ.get(name)
    if value is None:
        sys.exit(f"slow_link_peer: ${name} is not set (the driver sets it)")
    return int(value)


def read_corpus(path, seq):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < seq + 2:
        sys.exit(f"slow_link_peer: {path} holds {len(data)} bytes, fewer than seq + 2 = {seq + 2}")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def step_batch(tokens, step, rank, world):
    """This rank's slice of the global batch of `step`: (inputs, targets), each (B/world, seq)."""
    B, T = args.batch, args.seq
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    offsets = torch.randint(0, tokens.numel() - T - 1, (B,), generator=g)
    per_rank = B // world
    mine = offsets[rank * per_rank:(rank + 1) * per_rank]
    windows = torch.stack([tokens[o:o + T + 1] for o in mine.tolist()])
    return windows[:, :-1], windows[:, 1:]


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                             weight_decay=0.0, foreach=True)


def train(model, forward, opt, tokens, data_rank, data_world, rank, after_step=None):
    """Runs args.steps steps; returns (losses, step end times, start time)."""
    losses, ends = [], []
    start = time.time()
    for step in range(1, args.steps + 1):
        inputs, targets = step_batch(tokens, step, data_rank, data_world)
        opt.zero_grad(set_to_none=True)
        logits = forward(inputs)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if after_step is not None:
            after_step()
        ends.append(time.time())
        losses.append(float(loss.detach()))
        if rank == 0:
            print(f"step {step} loss {losses[-1]:.4f}", flush=True)
    return losses, ends, start


def new_model():
    torch.manual_seed(1337)  # the same initial weights on every rank and every mode
    model = ddp_peer.GPT(args.layers, args.d_model, args.heads, args.vocab, args.seq)
    model.train()
    # A constant buffer, the same everywhere: not state for DDP to broadcast.
    DDP._set_params_and_buffers_to_ignore_for_model(model, ["mask"])
    return model


def run_ddp(tokens):
    rank, world = env_int("RANK"), env_int("WORLD_SIZE")
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_s))
    model = new_model()
    ddp = DDP(model)
    hook = ""
    if args.mode == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
        state = powersgd.PowerSGDState(process_group=None,
                                       matrix_approximation_rank=args.powersgd_rank,
                                       start_powerSGD_iter=args.start_powersgd_iter)
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
        hook = (f" powerSGD_hook rank={args.powersgd_rank} "
                f"start_powerSGD_iter={args.start_powersgd_iter} "
                f"min_compression_rate={state.min_compression_rate}")
    if rank == 0:
        print(f"config: mode={args.mode} world={world} torch={torch.__version__} "
              f"GLOO_SOCKET_IFNAME={os.environ.get('GLOO_SOCKET_IFNAME')}{hook}", flush=True)
    result = train(model, ddp, adamw(model), tokens, rank, world, rank)
    dist.barrier()
    dist.destroy_process_group()
    return result


def run_diloco(tokens):
    from torchft import Manager, ProcessGroupGloo
    from torchft.checkpointing.http_transport import HTTPTransport
    from torchft.local_sgd import DiLoCo

    host_address = os.environ["MASTER_ADDR"]

    class HostTransport(HTTPTransport):
        """TorchFT's HTTP checkpoint transport, advertised at this host's address: its default,
        socket.gethostname(), names the machine, which every namespace resolves to loopback."""

        def address(self):
            return f"http://{host_address}:{self._server.socket.getsockname()[1]}/checkpoint/"

    local_rank, local_world = env_int("LOCAL_RANK"), env_int("LOCAL_WORLD_SIZE")
    group, groups = env_int("REPLICA_GROUP_ID"), env_int("NUM_REPLICA_GROUPS")
    if args.lighthouse is None:
        sys.exit("slow_link_peer: --mode diloco needs --lighthouse")
    # This host's own process group (its store is what the Manager expects at MASTER_ADDR:PORT).
    dist.init_process_group("gloo", rank=local_rank, world_size=local_world,
                            timeout=timedelta(seconds=args.timeout_s))
    model = new_model()
    forward = DDP(model) if local_world > 1 else model
    inner = adamw(model)
    outer = torch.optim.SGD(model.parameters(), lr=args.outer_lr, momentum=args.outer_momentum,
                            nesterov=True)

    def state_dict():
        return {"model": model.state_dict(), "inner": inner.state_dict()}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["inner"])

    timeout = timedelta(seconds=args.timeout_s)
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=groups,
                      use_async_quorum=False, load_state_dict=load_state_dict,
                      state_dict=state_dict, replica_id=f"slowlink_{group}", rank=local_rank,
                      world_size=local_world, store_addr=os.environ["MASTER_ADDR"],
                      store_port=int(os.environ["MASTER_PORT"]), lighthouse_addr=args.lighthouse,
                      hostname=host_address, timeout=timeout, quorum_timeout=timeout,
                      connect_timeout=timeout,
                      checkpoint_transport=HostTransport(timeout=timeout, num_chunks=0),
                      # Every replica starts from the same seeded weights, so no step-0 sync
                      # (TorchFT's advice): with it, the first quorum, at the first outer step,
                      # would heal all replicas but one from that one's state and drop their
                      # first round of inner steps.
                      init_sync=False)
    global_rank = group * local_world + local_rank
    if global_rank == 0:
        print(f"config: mode=diloco groups={groups} ranks_per_group={local_world} "
              f"every={args.every} outer_lr={args.outer_lr} "
              f"outer_momentum={args.outer_momentum} torch={torch.__version__}", flush=True)
    with DiLoCo(manager, [model], inner, outer, sync_every=args.every,
                backup_device=torch.device("cpu"), pin_memory=False):
        result = train(model, forward, inner, tokens, global_rank, groups * local_world,
                       global_rank)
    manager.shutdown(wait=False)
    dist.destroy_process_group()
    return result


def main():
    if args.batch % env_int("WORLD_SIZE") != 0:
        sys.exit(f"slow_link_peer: --batch {args.batch} is not divisible by the world size "
                 f"{env_int('WORLD_SIZE')}")
    torch.set_num_threads(args.threads)
    tokens = read_corpus(args.corpus, args.seq)
    losses, ends, start = run_diloco(tokens) if args.mode == "diloco" else run_ddp(tokens)
    try:
        import importlib.metadata as metadata
        torchft = metadata.version("torchft")
    except Exception:  # noqa: BLE001 (not installed: only diloco needs it)
        torchft = None
    os.makedirs(args.out, exist_ok=True)
    rank = env_int("RANK")
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "mode": args.mode, "torch": torch.__version__,
                   "torchft": torchft, "losses": losses, "ends": ends, "start": start}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
