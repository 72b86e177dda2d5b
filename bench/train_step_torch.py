#!/usr/bin/env python3
"""One GPT training step in PyTorch, the peer of bench/train_step_bench.cc.

The same model as Shardline's engine: GPT-2 blocks (pre-LayerNorm, fused qkv with bias, causal
attention, GELU tanh MLP with bias), learned positions, a final LayerNorm and a head tied to wte;
GPT-2 initialisation; AdamW (weight decay 0.1 on the 2-D tensors only, lr 3e-4, betas 0.9/0.999,
eps 1e-8) after clipping the global gradient norm to 1.0. Same shapes, random tokens, warmup then
timed steps of zero_grad + forward + backward + clip + step. AdamW runs its foreach (multi-tensor)
implementation unless --no-foreach: PyTorch at its best on the CPU.

Run it with Debian's /usr/bin/python3 (python3-torch):

  /usr/bin/python3 bench/train_step_torch.py [--layers 12] [--d-model 768] [--heads 12]
      [--seq 256] [--batch 4] [--vocab 50304] [--steps 3] [--warmup 1] [--threads 2]
      [--no-foreach] [--device cpu|cuda] [--precision fp32|bf16]

--device cuda (the peer of train_step_gpu_bench, with a CUDA build of torch): the model and batch
on GPU 0, fp32 parameters; --precision bf16 (the default there) runs the forward and loss under
torch.autocast(bfloat16), PyTorch's mixed precision with fp32 master weights, and AdamW is the
fused CUDA implementation. Each phase ends with torch.cuda.synchronize(), so phases add up to the
step.

Prints per-phase times and
  RESULT impl=pytorch tokens_per_s=... step_s=... params=... peak_bytes=... peak_kind=...
On the CPU peak_bytes is the process's peak resident set size (getrusage ru_maxrss, peak_kind
max_rss), NOT an allocator peak like Shardline's: it includes the Python interpreter and libtorch
itself (~hundreds of MiB), and tracemalloc cannot see torch's tensor memory. Compare it with care.
On CUDA it is torch.cuda.max_memory_allocated() (peak_kind allocator), comparable with ours.
"""
import argparse
import contextlib
import math
import os
import resource
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--llama", type=int, default=0,
                   help="1: a Llama (RMSNorm, SwiGLU, rotary positions, grouped-query attention)")
    p.add_argument("--kv-heads", type=int, default=0, help="Llama's key/value heads (0: heads)")
    p.add_argument("--d-ff", type=int, default=0, help="the MLP width (0: 4·d_model)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default=None,
                   help="default fp32 on cpu, bf16 on cuda (autocast)")
    p.add_argument("--init-from", default=None, metavar="DIR",
                   help="start from the parameters and batch train_step_bench --init-out DIR "
                        "wrote (its parameter layout mapped to these modules), so that the two "
                        "sides' losses can be compared step by step")
    p.add_argument("--foreach", action=argparse.BooleanOptionalAction, default=True,
                   help="AdamW's multi-tensor (foreach) implementation; torch 1.13 defaults to the "
                        "per-tensor loop on the CPU, which is several times slower")
    return p.parse_args()


args = parse_args()
if args.precision is None:
    args.precision = "bf16" if args.device == "cuda" else "fp32"
if args.precision == "bf16" and args.device != "cuda":
    sys.exit("train_step_torch: --precision bf16 needs --device cuda (as Shardline's CPU path)")
# Before torch loads: its OpenMP pool and OpenBLAS (Debian's torch uses the system BLAS) read these.
os.environ["OMP_NUM_THREADS"] = str(args.threads)
os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(args.threads)

HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")  # torch >= 2.0


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

    def attention(self, x, mask):
        B, T, C = x.shape
        hs = C // self.H
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.H, hs).transpose(1, 2)
        k = k.view(B, T, self.H, hs).transpose(1, 2)
        v = v.view(B, T, self.H, hs).transpose(1, 2)
        if HAVE_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(mask[:T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.attn_proj(y)

    def forward(self, x, mask):
        x = x + self.attention(self.ln1(x), mask)
        x = x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, layers, C, H, V, T):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, H) for _ in range(layers)])
        self.lnf = nn.LayerNorm(C, eps=1e-5)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        # True above the diagonal: the future that a position may not see.
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1))
        # GPT-2 initialisation, as Shardline's InitGpt2.
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p) if name.endswith(("ln1.weight", "ln2.weight", "lnf.weight")) \
                    else nn.init.zeros_(p)
            else:
                std = 0.02
                if name.endswith(("attn_proj.weight", "fc_proj.weight")):
                    std = 0.02 / math.sqrt(2 * layers)
                nn.init.normal_(p, 0.0, std)

    def embed(self, idx):
        T = idx.shape[1]
        return self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))

    def blocks(self, x):
        for block in self.h:
            x = block(x, self.mask)
        return x

    def head(self, x):
        return self.lm_head(self.lnf(x))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaBlock(nn.Module):
    """Hugging Face's LlamaDecoderLayer, its modules named after Shardline's tensors (ln1, q, k, v
    or the fused qkv when kv_heads == heads, attn_proj, ln2, gate, up, down) so that --init-from
    maps one to one."""

    def __init__(self, C, H, KV, F_):
        super().__init__()
        self.H, self.KV, self.hs = H, KV, C // H
        self.ln1 = nn.RMSNorm(C, eps=1e-5)
        if KV == H:
            self.qkv = nn.Linear(C, 3 * C, bias=False)
        else:
            self.q = nn.Linear(C, C, bias=False)
            self.k = nn.Linear(C, KV * self.hs, bias=False)
            self.v = nn.Linear(C, KV * self.hs, bias=False)
        self.attn_proj = nn.Linear(C, C, bias=False)
        self.ln2 = nn.RMSNorm(C, eps=1e-5)
        self.gate = nn.Linear(C, F_, bias=False)
        self.up = nn.Linear(C, F_, bias=False)
        self.down = nn.Linear(F_, C, bias=False)

    def attention(self, x, cos, sin):
        B, T, C = x.shape
        hs = self.hs
        if self.KV == self.H:
            q, k, v = self.qkv(x).split(C, dim=2)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        q = q.view(B, T, self.H, hs).transpose(1, 2)
        k = k.view(B, T, self.KV, hs).transpose(1, 2)
        v = v.view(B, T, self.KV, hs).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.KV != self.H:
            try:  # PyTorch 2.5+: the kernel reads each key/value head for its group
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            except TypeError:
                y = F.scaled_dot_product_attention(
                    q, k.repeat_interleave(self.H // self.KV, dim=1),
                    v.repeat_interleave(self.H // self.KV, dim=1), is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x, rope):
        cos, sin = rope
        x = x + self.attention(self.ln1(x), cos, sin)
        h = self.ln2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, layers, C, H, KV, F_, V, T, theta=10000.0):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.h = nn.ModuleList([LlamaBlock(C, H, KV, F_) for _ in range(layers)])
        self.lnf = nn.RMSNorm(C, eps=1e-5)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as SmolLM
        hs = C // H
        inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs))
        freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
            else:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("attn_proj.weight",
                                                                        "down.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def embed(self, idx):
        return self.wte(idx)

    def blocks(self, x):
        T = x.shape[1]
        rope = (self.cos[:T], self.sin[:T])
        for block in self.h:
            x = block(x, rope)
        return x

    def head(self, x):
        return self.lm_head(self.lnf(x))


def load_initial_state(model, folder, B, T):
    """Copies train_step_bench --init-out's parameters into `model`; returns its tokens (B, T)."""
    def read(name, dtype):
        with open(os.path.join(folder, name), "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=dtype)
    flat = read("params.bin", torch.float32)
    ours = dict(model.named_parameters())
    seen = set()
    with open(os.path.join(folder, "tensors.txt")) as f:
        for line in f:
            name, offset, *shape = line.split()
            shape = [int(d) for d in shape]
            numel = math.prod(shape)
            # Shardline's "h.0.qkv.w" is this module's "h.0.qkv.weight"; ".b" its ".bias".
            torch_name = name[:-2] + (".weight" if name.endswith(".w") else ".bias") \
                if name.endswith((".w", ".b")) else name + ".weight"
            if torch_name not in ours:
                sys.exit(f"train_step_torch: --init-from: no parameter {torch_name} for {name}")
            p = ours[torch_name]
            if list(p.shape) != shape:
                sys.exit(f"train_step_torch: --init-from: {name} is {shape}, {torch_name} "
                         f"{list(p.shape)}")
            with torch.no_grad():
                p.copy_(flat[int(offset):int(offset) + numel].view(shape))
            seen.add(torch_name)
    missing = set(ours) - seen
    if missing:
        sys.exit(f"train_step_torch: --init-from: {folder} has no value for {sorted(missing)}")
    tokens = read("tokens.bin", torch.int32)
    if tokens.numel() != B * T:
        sys.exit(f"train_step_torch: --init-from: {tokens.numel()} tokens, not B*T = {B * T}")
    return tokens.view(B, T).long()


def main():
    torch.manual_seed(1337)
    B, T, V = args.batch, args.seq, args.vocab
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("train_step_torch: --device cuda but torch.cuda.is_available() is False")
    device = torch.device(args.device)
    F_ = args.d_ff or 4 * args.d_model
    if args.llama:
        model = Llama(args.layers, args.d_model, args.heads, args.kv_heads or args.heads, F_, V,
                      T).to(device)
    else:
        model = GPT(args.layers, args.d_model, args.heads, V, T).to(device)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())  # wte counted once (tied)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    # PyTorch at its best on each device: foreach (multi-tensor) on the CPU, fused on CUDA.
    impl = {"fused": True} if cuda else {"foreach": args.foreach}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.999), eps=1e-8, **impl)

    g = torch.Generator().manual_seed(42)
    tokens = torch.randint(0, V, (B, T), generator=g)
    if args.init_from:
        tokens = load_initial_state(model, args.init_from, B, T)
    tokens = tokens.to(device)
    targets = torch.roll(tokens, shifts=-1, dims=1)  # next token; the last wraps to the first
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16") \
        if cuda else contextlib.nullcontext()
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    print(f"config: {'llama' if args.llama else 'gpt'} layers={args.layers} heads={args.heads} "
          f"kv_heads={args.kv_heads or args.heads} d_model={args.d_model} d_ff={F_} vocab={V} max_seq_len={T} tied B={B} T={T} params={n_params} "
          f"threads={torch.get_num_threads()} torch={torch.__version__} "
          f"attention={'sdpa' if HAVE_SDPA else 'manual_softmax'} adamw={impl} "
          f"device={args.device} precision={args.precision}",
          flush=True)

    names = ["zero_grad", "embed_fwd", "blocks_fwd", "head_fwd", "loss_fwd", "backward",
             "clip_grad", "adamw_step"]
    phase_total = dict.fromkeys(names, 0.0)
    timed_s = 0.0
    first_loss = last_loss = None
    for step in range(1, args.warmup + args.steps + 1):
        timed = step > args.warmup
        phase = {}
        start = t0 = time.perf_counter()

        def lap(name):
            nonlocal t0
            sync()
            t1 = time.perf_counter()
            phase[name] = t1 - t0
            t0 = t1

        opt.zero_grad(set_to_none=True)
        lap("zero_grad")
        with autocast:
            x = model.embed(tokens)
            lap("embed_fwd")
            x = model.blocks(x)
            lap("blocks_fwd")
            logits = model.head(x)
            lap("head_fwd")
            loss = F.cross_entropy(logits.view(-1, V).float(), targets.view(-1))
            lap("loss_fwd")
        loss.backward()
        lap("backward")
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        lap("clip_grad")
        opt.step()
        lap("adamw_step")
        step_s = time.perf_counter() - start
        loss_v = loss.item()
        first_loss = loss_v if first_loss is None else first_loss
        last_loss = loss_v
        print(f"step {step}{'' if timed else ' (warmup)'}: loss {loss_v:.4f} "
              f"grad_norm {norm.item():.4f} {step_s:.3f} s", flush=True)
        if timed:
            timed_s += step_s
            for k in names:
                phase_total[k] += phase[k]

    step_s = timed_s / args.steps
    print(f"phases (mean over {args.steps} timed steps):")
    for k in names:
        s = phase_total[k] / args.steps
        print(f"  {k:<15} {s:9.4f} s  {100.0 * s / step_s:5.1f}%")
    print("PHASES impl=pytorch " + " ".join(f"{k}={phase_total[k] / args.steps:.6f}" for k in names))
    print(f"loss: first {first_loss:.4f} last {last_loss:.4f}")
    if cuda:
        peak, peak_kind = torch.cuda.max_memory_allocated(), "allocator"
    else:
        peak, peak_kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "max_rss"
    print(f"RESULT impl=pytorch tokens_per_s={B * T / step_s:.2f} step_s={step_s:.6f} "
          f"params={n_params} peak_bytes={peak} peak_kind={peak_kind}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
