#!/usr/bin/python3
"""Hugging Face Llama folders in and out of Shardline, held against the real transformers.

  bench/setup-hf-check.sh [PREFIX]            # once: the pinned transformers, in its own prefix
  bench/hf_llama_check.py BUILD_DIR [--hf-prefix /opt/shardline-bench/hf] [--work-dir DIR]
      [--tokens 12]

For each case (F32 in one file; BF16 in several files with an index; grouped-query and
one-key/value-head-per-head attention; Llama 3 rope scaling; tied and untied heads; a Mistral
without a sliding window), transformers makes a random LlamaForCausalLM (MistralForCausalLM) and
saves it with save_pretrained, then:

  - in: `shardline generate --checkpoint DIR --tokenizer bytes` (our C++ model reading the folder
    as transformers wrote it) gives the greedy tokens transformers' argmax loop gives over the
    prompt's bytes as token ids (a step whose top two logits are closer than 1e-3 ends the
    comparison there: a tie, not a disagreement);
  - out: `shardline checkpoint export DIR --format hf --out OUT` writes a folder that
    LlamaForCausalLM.from_pretrained(OUT) loads, whose logits equal bit for bit those of the
    original folder as transformers loads it in f32 (a BF16 folder's export is its f32 widening).

Exit 0 when every check holds, 1 otherwise. Not part of ctest: transformers is a benchmark-only
peer, installed by bench/setup-hf-check.sh.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("build_dir")
    p.add_argument("--hf-prefix", default="/opt/shardline-bench/hf",
                   help="where bench/setup-hf-check.sh installed transformers")
    p.add_argument("--work-dir", help="keep the folders here (default: a temp dir)")
    p.add_argument("--prompt", default="the quick ")
    p.add_argument("--tokens", type=int, default=12, help="greedy tokens to compare")
    return p.parse_args()


CASES = [
    # name, dtype, shard size (None: one file), config overrides
    ("f32_one_file_gqa_llama3", "float32", None,
     dict(num_key_value_heads=2, rope_theta=500000.0,
          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    ("bf16_sharded_mha_tied", "bfloat16", "20KB",
     dict(num_key_value_heads=4, tie_word_embeddings=True)),
    ("f32_sharded_one_kv_head", "float32", "30KB", dict(num_key_value_heads=1)),
    ("mistral_no_window", "float32", None,
     dict(num_key_value_heads=2, sliding_window=None, mistral=True)),
]


def main():
    args = parse_args()
    sys.path.insert(0, args.hf_prefix)
    try:
        import torch
        import transformers
    except ImportError as error:
        sys.exit(f"transformers is not importable from {args.hf_prefix} ({error}); "
                 "run bench/setup-hf-check.sh first")
    shardline = os.path.join(args.build_dir, "cli", "shardline")
    work = args.work_dir or tempfile.mkdtemp(prefix="hf-llama-check-")
    os.makedirs(work, exist_ok=True)
    prompt = list(args.prompt.encode())
    failures = 0
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")

    for name, dtype, shard, overrides in CASES:
        overrides = dict(overrides)
        mistral = overrides.pop("mistral", False)
        config_class = transformers.MistralConfig if mistral else transformers.LlamaConfig
        model_class = (transformers.MistralForCausalLM if mistral
                       else transformers.LlamaForCausalLM)
        config = config_class(vocab_size=257, hidden_size=32, intermediate_size=48,
                              num_hidden_layers=2, num_attention_heads=4,
                              max_position_embeddings=64, rms_norm_eps=1e-5,
                              initializer_range=0.3, **overrides)
        torch.manual_seed(len(name))
        model = model_class(config).eval()
        folder = os.path.join(work, name)
        shutil.rmtree(folder, ignore_errors=True)
        kwargs = {"max_shard_size": shard} if shard else {}
        model.to(getattr(torch, dtype)).save_pretrained(folder, **kwargs)
        # The reference is the folder as transformers loads it in f32 (not the model in memory,
        # whose rotary inv_freq buffer went through bf16 with its weights).
        model = model_class.from_pretrained(folder, torch_dtype=torch.float32).eval()

        # In: greedy tokens.
        ids = list(prompt)
        expected, ties = [], None
        with torch.no_grad():
            for step in range(args.tokens):
                logits = model(torch.tensor([ids])).logits[0, -1]
                top = torch.topk(logits, 2)
                if (top.values[0] - top.values[1]).item() < 1e-3 and ties is None:
                    ties = step
                ids.append(int(top.indices[0]))
                expected.append(ids[-1])
        run = subprocess.run([shardline, "generate", "--checkpoint", folder, "--prompt",
                              args.prompt, "--max-new-tokens", str(args.tokens), "--tokenizer",
                              "bytes"], capture_output=True)
        want = b"".join(bytes([t]) if t < 256 else b"<|endoftext|>" for t in expected)
        got = run.stdout[len(args.prompt.encode()):].rstrip(b"\n")
        compared = args.tokens if ties is None else ties
        want_part = b"".join(bytes([t]) if t < 256 else b"<|endoftext|>"
                             for t in expected[:compared])
        ok_in = run.returncode == 0 and got.startswith(want_part)
        print(f"{name}: generate {'OK' if ok_in else 'FAILED'} ({compared} of {args.tokens} "
              f"greedy tokens compared{'' if ties is None else ', then a tie'})")
        if not ok_in:
            print(f"  want {want!r}\n  got  {got!r}\n  {run.stderr.decode()}")
            failures += 1

        # Out: export, and transformers loads it.
        out = folder + "_export"
        shutil.rmtree(out, ignore_errors=True)
        run = subprocess.run([shardline, "checkpoint", "export", folder, "--format", "hf",
                              "--out", out], capture_output=True, text=True)
        if run.returncode != 0:
            print(f"{name}: export FAILED: {run.stdout}{run.stderr}")
            failures += 1
            continue
        back = transformers.LlamaForCausalLM.from_pretrained(out).eval()
        with torch.no_grad():
            tokens = torch.tensor([ids])
            a = model(tokens).logits
            b = back(tokens).logits
        diff = (a - b).abs().max().item()
        exact = torch.equal(a, b)
        ok_out = exact
        print(f"{name}: export loads in transformers, logits {'equal' if exact else 'differ'} "
              f"(max |diff| {diff:.3g}) {'OK' if ok_out else 'FAILED'}")
        if not ok_out:
            failures += 1

    print("all checks hold" if failures == 0 else f"{failures} check(s) FAILED")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
