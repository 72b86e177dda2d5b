#!/usr/bin/python3
"""PyTorch reference for tests/unit/model_torch_reference_test.cc.

Usage: /usr/bin/python3 model_torch_reference.py DIR

DIR holds what the C++ test wrote: model.json (config, batch shape, every tensor's name, offset
and shape in the flat parameter buffer), params.bin (that buffer, little-endian f32), tokens.bin
and targets.bin ((B,T) little-endian int32; a negative target is ignored). This script builds the
same GPT-2 in torch (pre-LayerNorm blocks, LayerNorm eps 1e-5, causal attention, GELU tanh, the
head tied to wte unless lm_head.w exists), runs it in float64, and writes back to DIR:
logits.bin ((B,T,V) f32), grads.bin (the gradient of the mean loss in the parameter buffer's
layout, f32) and loss.json ({"loss": ...}).
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F


def main(directory):
    with open(os.path.join(directory, "model.json")) as f:
        spec = json.load(f)
    cfg = spec["config"]
    B, T = spec["batch"], spec["seq_len"]
    L, NH, C, V = cfg["layers"], cfg["heads"], cfg["d_model"], cfg["vocab"]
    HS = C // NH

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
    logits = ln(x, "lnf") @ head.T  # (B,T,V)
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


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: model_torch_reference.py DIR")
    main(sys.argv[1])
