#!/usr/bin/python3
"""PyTorch reference for tests/unit/model_torch_reference_test.cc.

Usage: /usr/bin/python3 model_torch_reference.py DIR

DIR holds what the C++ test wrote: model.json (config, batch shape, every tensor's name, offset
and shape in the flat parameter buffer), params.bin (that buffer, little-endian f32), tokens.bin
and targets.bin ((B,T) little-endian int32; a negative target is ignored). This script builds the
same model in torch, written here independently of Shardline's engine, runs it in float64, and
writes back to DIR: logits.bin ((B,T,V) f32), grads.bin (the gradient of the mean loss in the
parameter buffer's layout, f32) and loss.json ({"loss": ...}).

Two families, as config["arch"] says:
  - "gpt": GPT-2 (pre-LayerNorm blocks, LayerNorm eps 1e-5, causal attention, GELU tanh, learned
    positions, the head tied to wte unless lm_head.w exists);
  - "llama": Hugging Face's LlamaForCausalLM as modeling_llama.py computes it, over tensors in the
    Hugging Face layout (q_proj, k_proj, v_proj, o_proj, gate/up/down_proj, input_layernorm,
    post_attention_layernorm, norm, embed_tokens, lm_head), taken from Shardline's names:
    RMSNorm, rotary positions in the rotate_half layout with rope_theta and, when given, Llama 3's
    frequency rescaling, grouped-query attention by repeating each key/value head, SwiGLU.
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F


def llama3_inv_freq(inv_freq, scaling):
    """transformers' _compute_llama3_parameters (modeling_rope_utils.py)."""
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context / low
    high_freq_wavelen = old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def llama_logits(cfg, p, tokens):
    B, T = tokens.shape
    L, NH, KV, C = cfg["layers"], cfg["heads"], cfg["kv_heads"], cfg["d_model"]
    HD = cfg["head_dim"]
    eps = cfg["norm_eps"]

    def rms_norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    # Shardline's names → the Hugging Face layout (a fused qkv.w is q_proj, k_proj, v_proj stacked).
    def hf(l):
        h = f"h.{l}."
        if h + "qkv.w" in p:
            q, k, v = p[h + "qkv.w"].split([NH * HD, KV * HD, KV * HD], dim=0)
        else:
            q, k, v = p[h + "q.w"], p[h + "k.w"], p[h + "v.w"]
        return {"input_layernorm": p[h + "ln1.w"], "q_proj": q, "k_proj": k, "v_proj": v,
                "o_proj": p[h + "attn_proj.w"], "post_attention_layernorm": p[h + "ln2.w"],
                "gate_proj": p[h + "gate.w"], "up_proj": p[h + "up.w"],
                "down_proj": p[h + "down.w"]}

    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD))
    if cfg.get("rope_scaling"):
        inv_freq = llama3_inv_freq(inv_freq, cfg["rope_scaling"])
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()  # (T, HD)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))

    x = p["wte"][tokens]
    for l in range(L):
        w = hf(l)
        h = rms_norm(x, w["input_layernorm"])
        q = (h @ w["q_proj"].T).view(B, T, NH, HD).transpose(1, 2)
        k = (h @ w["k_proj"].T).view(B, T, KV, HD).transpose(1, 2)
        v = (h @ w["v_proj"].T).view(B, T, KV, HD).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // KV, dim=1)  # repeat_kv
        v = v.repeat_interleave(NH // KV, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(HD)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * HD)
        x = x + y @ w["o_proj"].T
        h = rms_norm(x, w["post_attention_layernorm"])
        x = x + (F.silu(h @ w["gate_proj"].T) * (h @ w["up_proj"].T)) @ w["down_proj"].T
    head = p.get("lm_head.w", p["wte"])
    return rms_norm(x, p["lnf.w"]) @ head.T


def main(directory):
    with open(os.path.join(directory, "model.json")) as f:
        spec = json.load(f)
    cfg = spec["config"]
    B, T = spec["batch"], spec["seq_len"]
    V = cfg["vocab"]

    flat = np.fromfile(os.path.join(directory, "params.bin"), dtype="<f4")
    tokens = torch.from_numpy(
        np.fromfile(os.path.join(directory, "tokens.bin"), dtype="<i4").astype(np.int64)
    ).view(B, T)
    targets = torch.from_numpy(
        np.fromfile(os.path.join(directory, "targets.bin"), dtype="<i4").astype(np.int64)
    ).view(B, T)

    params = {}
    for t in spec["tensors"]:
        n = int(np.prod(t["shape"]))
        data = flat[t["offset"]:t["offset"] + n].astype(np.float64).reshape(t["shape"])
        params[t["name"]] = torch.tensor(data, dtype=torch.float64, requires_grad=True)
    assert sum(int(np.prod(t["shape"])) for t in spec["tensors"]) == flat.size

    if cfg.get("arch") == "llama":
        logits = llama_logits(cfg, params, tokens)
    else:
        logits = gpt_logits(cfg, params, tokens)
    # Shardline's loss: the mean over every position of the batch, an ignored one (target -1)
    # counting 0 (worker/model/sharded_gpt.cc). Without ignored targets it is F.cross_entropy's
    # default mean.
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-1,
                           reduction="sum") / targets.numel()
    loss.backward()

    logits.detach().numpy().astype("<f4").tofile(os.path.join(directory, "logits.bin"))
    grads = np.zeros_like(flat)
    for t in spec["tensors"]:
        n = int(np.prod(t["shape"]))
        grads[t["offset"]:t["offset"] + n] = params[t["name"]].grad.numpy().reshape(-1)
    grads.astype("<f4").tofile(os.path.join(directory, "grads.bin"))
    with open(os.path.join(directory, "loss.json"), "w") as f:
        json.dump({"loss": loss.item(), "torch": torch.__version__}, f)


def gpt_logits(cfg, params, tokens):
    B, T = tokens.shape
    L, NH, C = cfg["layers"], cfg["heads"], cfg["d_model"]
    HS = C // NH

    def p(name):
        return params[name]

    def ln(x, prefix):
        return F.layer_norm(x, (C,), p(prefix + ".w"), p(prefix + ".b"), eps=1e-5)

    x = p("wte")[tokens] + p("wpe")[:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        h = f"h.{l}."
        qkv = ln(x, h + "ln1") @ p(h + "qkv.w").T + p(h + "qkv.b")  # (B,T,3C)
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, HS).transpose(1, 2)  # (B,NH,T,HS)
        k = k.view(B, T, NH, HS).transpose(1, 2)
        v = v.view(B, T, NH, HS).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p(h + "attn_proj.w").T + p(h + "attn_proj.b")
        m = F.gelu(ln(x, h + "ln2") @ p(h + "fc.w").T + p(h + "fc.b"), approximate="tanh")
        x = x + m @ p(h + "fc_proj.w").T + p(h + "fc_proj.b")
    head = params.get("lm_head.w", p("wte"))
    return ln(x, "lnf") @ head.T  # (B,T,V)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: model_torch_reference.py DIR")
    main(sys.argv[1])
