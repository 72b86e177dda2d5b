#!/usr/bin/python3
"""A Shardline checkpoint exported as Hugging Face GPT-2, held against the real transformers.

  bench/setup-hf-check.sh                     # once: the pinned transformers, in its own prefix
  bench/hf_export_check.py BUILD_DIR [--checkpoint CKPT] [--prompt TEXT] [--tokens 16]
      [--hf-prefix /opt/shardline-bench/hf] [--work-dir DIR]

Without --checkpoint it trains two small models with BUILD_DIR/cli/shardline train (a tied head,
and an untied one with d_ff other than 4·d_model) on a repeated sentence; with it, it checks that
checkpoint (a run's dir, a step, or a single model file). For each, it runs
`shardline checkpoint export --format hf`, loads the folder with
transformers.GPT2LMHeadModel.from_pretrained, and checks:

  - greedy continuation: `shardline generate` (our C++ model, reading the exported folder and the
    original checkpoint) and transformers' argmax loop over the prompt's bytes as token ids give
    the same --tokens tokens;
  - logits: transformers' f32 logits over prompt + continuation against a float64 PyTorch forward
    of our model computed from the original checkpoint's tensors by our names (the same math as
    tests/unit/model_torch_reference.py, which the C++ model is tested against); prints the max
    absolute difference, which must stay under --tolerance;
  - the head is tied in transformers exactly when the checkpoint's is.

Exit 0 when every check holds, 1 otherwise. Not part of ctest: transformers is a benchmark-only
peer, installed by bench/setup-hf-check.sh.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

EOT = 256  # the byte tokenizer's end-of-text token (worker/model/data/byte_tokenizer.h)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("build_dir")
    p.add_argument("--checkpoint", help="check this checkpoint instead of training two")
    p.add_argument("--prompt", default="the quick ")
    p.add_argument("--tokens", type=int, default=16, help="greedy tokens to compare")
    p.add_argument("--hf-prefix", default="/opt/shardline-bench/hf",
                   help="where bench/setup-hf-check.sh installed transformers")
    p.add_argument("--work-dir", help="keep the runs and exports here (default: a temp dir)")
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="largest |logit difference| accepted")
    return p.parse_args()


def run(cmd):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace"))
        sys.exit(f"hf_export_check: {' '.join(cmd)} exited with {proc.returncode}")
    return proc.stdout


SPEC = """name: {name}
model:
  layers: 2
  heads: 4
  d_model: 64
  max_seq_len: 64
{extra}data:
  path: {corpus}
optimizer:
  lr: 1.0e-2
  warmup_steps: 5
steps: 100
batch: 4
seq_len: 64
seed: 5
log_interval: 50
checkpoint:
  dir: {ckpt}
  interval: 50
"""


def train(shardline, work, name, extra):
    corpus = os.path.join(work, "corpus.txt")
    if not os.path.exists(corpus):
        with open(corpus, "w") as f:
            f.write("the quick brown fox jumps over the lazy dog. " * 400)
    ckpt = os.path.join(work, name + "-ckpt")
    spec = os.path.join(work, name + ".yaml")
    with open(spec, "w") as f:
        f.write(SPEC.format(name=name, extra=extra, corpus=corpus, ckpt=ckpt))
    run([shardline, "train", spec])
    return ckpt


def our_tensors(checkpoint):
    """Our parameters by our names as float64 numpy arrays, and the config, from a checkpoint step
    (every tensor assembled from its shards' boxes, so any plan's checkpoint works) or a single
    model file of our format."""
    import numpy as np
    from safetensors.numpy import load_file

    path = checkpoint
    if os.path.isdir(path):
        latest = os.path.join(path, "latest")
        if os.path.exists(os.path.join(path, "manifest.json")):
            path = os.path.join(path, "manifest.json")
        elif os.path.exists(latest):
            with open(latest) as f:
                path = os.path.join(path, f.read().strip(), "manifest.json")
        else:
            path = os.path.join(path, "model.safetensors")
    if path.endswith(".json"):
        with open(path) as f:
            manifest = json.load(f)
        folder = os.path.dirname(path)
        files = {}
        tensors = {}
        for name, t in manifest["tensors"].items():
            if name.startswith("optim."):
                continue
            out = np.empty(t["global_shape"], dtype=np.float64)
            for shard in t["shards"]:
                if shard["file"] not in files:
                    files[shard["file"]] = load_file(os.path.join(folder, shard["file"]))
                box = tuple(slice(o, o + s) for o, s in zip(shard["offsets"], shard["shape"]))
                out[box] = files[shard["file"]][shard["tensor"]]
            tensors[name] = out
        meta = manifest["metadata"]
    else:
        from safetensors import safe_open
        with safe_open(path, framework="np") as f:
            meta = f.metadata()
        tensors = {k: v.astype(np.float64) for k, v in load_file(path).items()}
    config = {k: int(meta[k]) for k in ("n_layer", "n_embd", "n_head", "d_ff", "vocab_size",
                                         "n_positions")}
    config["tied"] = meta.get("tied_embeddings", "true") == "true"
    return tensors, config


def reference_logits(tensors, config, ids):
    """(T, V) logits of our GPT over `ids`, float64: pre-LayerNorm blocks (eps 1e-5), causal
    attention scaled by 1/sqrt(head size), the tanh GELU, the head tied to wte unless lm_head.w."""
    import torch
    import torch.nn.functional as F

    p = {k: torch.from_numpy(v) for k, v in tensors.items()}
    C, NH, T = config["n_embd"], config["n_head"], len(ids)
    HS = C // NH
    tok = torch.tensor(ids)

    def ln(x, prefix):
        return F.layer_norm(x, (C,), p[prefix + ".w"], p[prefix + ".b"], eps=1e-5)

    x = p["wte"][tok] + p["wpe"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(config["n_layer"]):
        h = f"h.{l}."
        qkv = ln(x, h + "ln1") @ p[h + "qkv.w"].reshape(3 * C, C).T + p[h + "qkv.b"].reshape(-1)
        q, k, v = (t.view(T, NH, HS).transpose(0, 1) for t in qkv.split(C, dim=1))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + y @ p[h + "attn_proj.w"].T + p[h + "attn_proj.b"]
        m = F.gelu(ln(x, h + "ln2") @ p[h + "fc.w"].T + p[h + "fc.b"], approximate="tanh")
        x = x + m @ p[h + "fc_proj.w"].T + p[h + "fc_proj.b"]
    head = p.get("lm_head.w", p["wte"])
    return ln(x, "lnf") @ head.T


def decode(ids):
    return b"".join(b"<|endoftext|>" if i == EOT else bytes([i]) for i in ids)


def check(shardline, work, name, checkpoint, prompt, tokens, tolerance):
    import torch
    from transformers import GPT2LMHeadModel

    out = os.path.join(work, name + "-hf")
    shutil.rmtree(out, ignore_errors=True)  # ours, from an earlier run in the same --work-dir
    run([shardline, "checkpoint", "export", checkpoint, "--format", "hf", "--out", out])
    # A tensor under a name transformers does not expect would be initialised at random, with
    # only a logged warning: the loading report makes that a failure.
    model, loading = GPT2LMHeadModel.from_pretrained(out, output_loading_info=True)
    model.eval()
    tensors, config = our_tensors(checkpoint)
    ok = True
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        if loading.get(kind):
            print(f"{name}: FAIL: from_pretrained reports {kind}: {loading[kind]}")
            ok = False

    hf_tied = model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    if hf_tied != config["tied"]:
        print(f"{name}: FAIL: transformers' head is {'tied' if hf_tied else 'untied'}, "
              f"the checkpoint's {'tied' if config['tied'] else 'untied'}")
        ok = False

    prompt_ids = list(prompt.encode())
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(tokens):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
        hf_logits = model(torch.tensor([ids])).logits[0].double()
    hf_text = prompt.encode() + decode(ids[len(prompt_ids):])

    generate = ["--prompt", prompt, "--max-new-tokens", str(tokens)]
    ours_hf = run([shardline, "generate", "--checkpoint", out] + generate).rstrip(b"\n")
    ours_ckpt = run([shardline, "generate", "--checkpoint", checkpoint] + generate).rstrip(b"\n")
    print(f"{name}: transformers {hf_text!r}")
    print(f"{name}: shardline (export)     {ours_hf!r}")
    print(f"{name}: shardline (checkpoint) {ours_ckpt!r}")
    if not (hf_text == ours_hf == ours_ckpt):
        print(f"{name}: FAIL: the greedy continuations differ")
        ok = False

    ref = reference_logits(tensors, config, ids)
    diff = (hf_logits - ref).abs().max().item()
    scale = ref.abs().max().item()
    print(f"{name}: max |logit difference| transformers vs our model's float64 forward: {diff:.3e}"
          f" (logits up to {scale:.2f}, over {len(ids)} positions x {ref.shape[1]} tokens)")
    if not diff < tolerance:
        print(f"{name}: FAIL: above the tolerance {tolerance}")
        ok = False
    return ok


def main():
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder: nothing to fetch
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    sys.path.insert(0, args.hf_prefix)
    try:
        import transformers
    except ImportError as e:
        sys.exit(f"hf_export_check: cannot import transformers from {args.hf_prefix} ({e}); "
                 "run bench/setup-hf-check.sh first")
    import torch
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    shardline = os.path.join(args.build_dir, "cli", "shardline")
    work = args.work_dir or tempfile.mkdtemp(prefix="shardline-hf-check-")
    os.makedirs(work, exist_ok=True)

    if args.checkpoint:
        runs = [("checkpoint", args.checkpoint)]
    else:
        runs = [("tied", train(shardline, work, "tied", "")),
                ("untied", train(shardline, work, "untied", "  tied_embeddings: false\n"
                                                            "  d_ff: 96\n"))]
    results = [check(shardline, work, name, ckpt, args.prompt, args.tokens, args.tolerance)
               for name, ckpt in runs]
    print("hf_export_check: " + ("OK" if all(results) else "FAILED") + f" ({work})")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
