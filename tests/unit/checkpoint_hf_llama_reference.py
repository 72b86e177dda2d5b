#!/usr/bin/python3
"""Hugging Face Llama folders for checkpoint_hf_llama_test, written and read by PyTorch.

transformers and the safetensors package are not installed here (nor needed): the folders follow
what LlamaForCausalLM.save_pretrained writes — config.json, model.safetensors or several
model-0000i-of-0000n.safetensors with model.safetensors.index.json — and the safetensors format by
its specification (an 8-byte little-endian header length, a JSON header padded with spaces to 8
bytes, the tensors' bytes back to back). The forward is tests/unit/model_torch_reference.py's
llama_logits (modeling_llama.py's computation, in float64).

  checkpoint_hf_llama_reference.py write SPEC.json DIR EXPECTED
      SPEC: {"config": {config.json's keys}, "dtype": "F32"|"BF16"|"F16", "files": n (0: one
      model.safetensors), "seed": s, "tokens": [...], "lm_head": true|false (store lm_head.weight
      even when tied), "scale": the weights' standard deviation, "greedy": n (also write the n
      tokens greedy decoding gives after `tokens`), "printable_head": true|false (an untied head
      whose rows of tokens other than 'a'..'z' are scaled by 0.01, so that greedy text is
      printable)}.
      Writes DIR/config.json and the weights (random), and into the folder EXPECTED: values.bin
      (every stored tensor converted to f32 by torch, back to back, little-endian), tensors.json
      ({name: {"offset": elements, "shape": [...]}}), logits.bin ((T, V) f32 of the tokens,
      from the stored values) and, with "greedy", greedy.json ({"tokens": [...], "min_gap": the
      smallest lead of the chosen token's logit over the next, so a test can tell a tie}).
  checkpoint_hf_llama_reference.py logits DIR TOKENS.json OUT.bin
      Reads the folder DIR (a Shardline export) with this script's own reader — config.json in
      either transformers form, one file or an index — and writes the logits of TOKENS.json's
      tokens to OUT.bin.

Exit code 77 means torch is missing (the test then skips).
"""
import json
import os
import struct
import sys

try:
    import numpy as np
    import torch
except ImportError as error:
    print(f"torch/numpy unavailable: {error}", file=sys.stderr)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_torch_reference import llama_logits  # noqa: E402

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
          "F64": torch.float64}
NAMES = {v: k for k, v in DTYPES.items()}


def tensor_bytes(t):
    t = t.contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):  # numpy has no bfloat16: move the bits
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def write_safetensors(path, tensors):
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, t in tensors.items():
        data = tensor_bytes(t)
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        raw = bytearray(body[begin:end])
        if dtype in (torch.bfloat16, torch.float16):
            t = torch.frombuffer(raw, dtype=torch.int16).view(dtype)
        else:
            t = torch.frombuffer(raw, dtype=dtype)
        tensors[name] = t.reshape(info["shape"]).clone()
    return tensors


def read_folder(directory):
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        tensors = {}
        for file in sorted(set(weight_map.values())):
            tensors.update(read_safetensors(os.path.join(directory, file)))
        return tensors
    return read_safetensors(os.path.join(directory, "model.safetensors"))


def model_config(hf):
    """llama_logits' config from config.json, in either transformers form."""
    heads = hf["num_attention_heads"]
    kv = hf.get("num_key_value_heads") or heads
    rope = hf.get("rope_parameters")
    if rope is not None:  # transformers 5
        theta, scaling = rope.get("rope_theta", 10000.0), rope
    else:  # transformers 4
        theta, scaling = hf.get("rope_theta", 10000.0), hf.get("rope_scaling")
    if scaling is not None and scaling.get("rope_type", scaling.get("type")) != "llama3":
        scaling = None
    return {"layers": hf["num_hidden_layers"], "heads": heads, "kv_heads": kv,
            "d_model": hf["hidden_size"],
            "head_dim": hf.get("head_dim") or hf["hidden_size"] // heads,
            "norm_eps": hf.get("rms_norm_eps", 1e-6), "rope_theta": theta,
            "rope_scaling": scaling}


def shardline_names(hf, tensors):
    """The stored tensors in float64 under the names llama_logits takes."""
    p = {"wte": tensors["model.embed_tokens.weight"], "lnf.w": tensors["model.norm.weight"]}
    for l in range(hf["num_hidden_layers"]):
        m = f"model.layers.{l}."
        for ours, theirs in [("ln1.w", "input_layernorm"), ("q.w", "self_attn.q_proj"),
                             ("k.w", "self_attn.k_proj"), ("v.w", "self_attn.v_proj"),
                             ("attn_proj.w", "self_attn.o_proj"),
                             ("ln2.w", "post_attention_layernorm"), ("gate.w", "mlp.gate_proj"),
                             ("up.w", "mlp.up_proj"), ("down.w", "mlp.down_proj")]:
            p[f"h.{l}.{ours}"] = tensors[m + theirs + ".weight"]
    if not hf.get("tie_word_embeddings", False):
        p["lm_head.w"] = tensors["lm_head.weight"]
    return {k: v.double() for k, v in p.items()}


def logits_of(hf, tensors, tokens):
    with torch.no_grad():
        out = llama_logits(model_config(hf), shardline_names(hf, tensors),
                           torch.tensor([tokens], dtype=torch.int64))
    return out[0].numpy().astype("<f4")


def write(spec_path, directory, expected):
    with open(spec_path) as f:
        spec = json.load(f)
    hf = spec["config"]
    torch.manual_seed(spec.get("seed", 0))
    dtype = DTYPES[spec["dtype"]]
    scale = spec.get("scale", 0.3)
    C, F, V = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
    NH = hf["num_attention_heads"]
    KV = hf.get("num_key_value_heads") or NH
    HD = hf.get("head_dim") or C // NH

    def matrix(rows, cols):
        return (torch.randn(rows, cols) * scale).to(dtype)

    def gain():
        return (1.0 + 0.1 * torch.randn(C)).to(dtype)

    tensors = {"model.embed_tokens.weight": matrix(V, C)}
    for l in range(hf["num_hidden_layers"]):
        m = f"model.layers.{l}."
        tensors[m + "input_layernorm.weight"] = gain()
        tensors[m + "self_attn.q_proj.weight"] = matrix(NH * HD, C)
        tensors[m + "self_attn.k_proj.weight"] = matrix(KV * HD, C)
        tensors[m + "self_attn.v_proj.weight"] = matrix(KV * HD, C)
        tensors[m + "self_attn.o_proj.weight"] = matrix(C, NH * HD)
        tensors[m + "post_attention_layernorm.weight"] = gain()
        tensors[m + "mlp.gate_proj.weight"] = matrix(F, C)
        tensors[m + "mlp.up_proj.weight"] = matrix(F, C)
        tensors[m + "mlp.down_proj.weight"] = matrix(C, F)
    tensors["model.norm.weight"] = gain()
    if not hf.get("tie_word_embeddings", False):
        head = torch.randn(V, C) * scale
        if spec.get("printable_head", False):
            rows = torch.full((V, 1), 0.01)
            rows[ord("a"):ord("z") + 1] = 1.0
            head = head * rows
        tensors["lm_head.weight"] = head.to(dtype)
    elif spec.get("lm_head", False):
        # save_pretrained of a tied model stores the head as the embedding's copy.
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()

    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf, f, indent=2)
    files = spec.get("files", 0)
    if files == 0:
        write_safetensors(os.path.join(directory, "model.safetensors"), tensors)
    else:
        names = list(tensors)
        weight_map = {}
        for i in range(files):
            file = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
            part = {n: tensors[n] for n in names[i::files]}
            write_safetensors(os.path.join(directory, file), part)
            weight_map.update({n: file for n in part})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)

    os.makedirs(expected, exist_ok=True)
    layout, offset, values = {}, 0, []
    for name, t in tensors.items():
        layout[name] = {"offset": offset, "shape": list(t.shape)}
        offset += t.numel()
        values.append(t.float().flatten().numpy())
    np.concatenate(values).astype("<f4").tofile(os.path.join(expected, "values.bin"))
    with open(os.path.join(expected, "tensors.json"), "w") as f:
        json.dump(layout, f)
    logits_of(hf, tensors, spec["tokens"]).tofile(os.path.join(expected, "logits.bin"))
    if spec.get("greedy", 0) > 0:
        sequence, chosen, min_gap = list(spec["tokens"]), [], float("inf")
        for _ in range(spec["greedy"]):
            last = torch.from_numpy(logits_of(hf, tensors, sequence)[-1]).double()
            top = torch.topk(last, 2)
            min_gap = min(min_gap, (top.values[0] - top.values[1]).item())
            chosen.append(int(top.indices[0]))
            sequence.append(chosen[-1])
        if spec.get("printable_head", False) and not all(
                ord("a") <= t <= ord("z") for t in chosen):
            sys.exit(f"greedy tokens {chosen} are not all 'a'..'z': choose another seed")
        with open(os.path.join(expected, "greedy.json"), "w") as f:
            json.dump({"tokens": chosen, "min_gap": min_gap}, f)


def logits(directory, tokens_path, out_path):
    with open(os.path.join(directory, "config.json")) as f:
        hf = json.load(f)
    assert hf["architectures"] == ["LlamaForCausalLM"], hf["architectures"]
    assert hf["model_type"] == "llama", hf["model_type"]
    with open(tokens_path) as f:
        tokens = json.load(f)
    logits_of(hf, read_folder(directory), tokens).tofile(out_path)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 5 and sys.argv[1] == "logits":
        logits(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)
