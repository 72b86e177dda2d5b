#!/usr/bin/env python3
"""The serving benchmark's peer (bench/serve_compare.py runs it in a process of its own, with the
Python of bench/setup-torch2.sh's venv): Hugging Face transformers on PyTorch 2.

  serve_hf_peer.py make-model OUT --layers L --d-model D --heads H [--vocab 50257]
      [--max-seq-len 1024] [--seed 0] [--llama --kv-heads K --d-ff F] --tokenizer-dir DIR
  serve_hf_peer.py generate MODEL --prompts FILE --batches 1,2,4,8 --requests N --max-tokens T
      [--threads 2]

make-model: a GPT2LMHeadModel with GPT-2's random initialisation (seeded), saved as a Hugging Face
folder (config.json, model.safetensors) with GPT-2's tokenizer files beside it (DIR's encoder.json
and vocab.bpe as vocab.json and merges.txt): the folder both sides load. --llama: a
LlamaForCausalLM instead (K key/value heads, SwiGLU width F, tied embeddings as SmolLM's,
transformers' own initialisation), with the same tokenizer files.

generate: for each batch size B, the N requests (request i has prompt i mod len(prompts)) in
batches of B prompts padded on the left, each a greedy `generate` of exactly T new tokens
(min_new_tokens = max_new_tokens: end-of-text does not stop it), one batch after the other. A
streamer timestamps every step: a request's TTFT is the time from the `generate` call to its
batch's first token, its inter-token latencies the gaps between its batch's later tokens. Prints
one line per batch size:
  RESULT {"batch": B, "wall_s": ..., "tokens": ..., "requests": [{"ttft": s, "itl": [s, ...],
          "tokens": T, "text": ...}, ...], "torch": ..., "transformers": ...}
after an untimed warm-up batch of B prompts and 4 tokens.
"""
import argparse
import json
import os
import shutil
import sys
import time


def make_model(a):
    import torch
    torch.manual_seed(a.seed)
    if a.llama:
        from transformers import LlamaConfig, LlamaForCausalLM
        config = LlamaConfig(num_hidden_layers=a.layers, hidden_size=a.d_model,
                             num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                             intermediate_size=a.d_ff, vocab_size=a.vocab,
                             max_position_embeddings=a.max_seq_len, tie_word_embeddings=True,
                             rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=50256,
                             eos_token_id=50256)
        model = LlamaForCausalLM(config)
    else:
        from transformers import GPT2Config, GPT2LMHeadModel
        config = GPT2Config(n_layer=a.layers, n_embd=a.d_model, n_head=a.heads,
                            vocab_size=a.vocab, n_positions=a.max_seq_len)
        model = GPT2LMHeadModel(config)
    model.save_pretrained(a.out)
    shutil.copy(os.path.join(a.tokenizer_dir, "encoder.json"), os.path.join(a.out, "vocab.json"))
    shutil.copy(os.path.join(a.tokenizer_dir, "vocab.bpe"), os.path.join(a.out, "merges.txt"))
    if a.llama:
        # A LlamaForCausalLM folder names its tokenizer: without tokenizer_config.json's class
        # AutoTokenizer (llama.cpp's converter uses it) takes Llama's SentencePiece one. Only the
        # class, beside GPT-2's files: a tokenizer.json saved by transformers 5 tokenizes the
        # converter's check text otherwise than GPT-2's, which it then does not recognise.
        with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>",
                       "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
                       "add_prefix_space": False}, f)
    params = sum(p.numel() for p in model.parameters())
    print(f"made {a.out}: {type(model).__name__}, {params} parameters, seed {a.seed}",
          flush=True)


class StepClock:
    """A transformers streamer that timestamps each put: the prompt first, then every step."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def generate(a):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GPT2Tokenizer
    torch.set_num_threads(a.threads)
    transformers.logging.set_verbosity_error()
    with open(a.prompts) as f:
        prompts = json.load(f)
    tokenizer = GPT2Tokenizer.from_pretrained(a.model)
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(a.model).eval()  # GPT-2 or Llama, as saved

    def run_batch(batch_prompts, max_tokens):
        enc = tokenizer(batch_prompts, return_tensors="pt", padding=True)
        clock = StepClock()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                 do_sample=False, num_beams=1, pad_token_id=tokenizer.eos_token_id,
                                 streamer=clock)
        end = time.perf_counter()
        new = out[:, enc.input_ids.shape[1]:]
        return start, end, clock.times[1:], new  # times[0]: the prompt's put

    for batch in a.batches:
        run_batch([prompts[i % len(prompts)] for i in range(batch)], 4)  # warm-up
        requests, tokens, wall = [], 0, 0.0
        for first in range(0, a.requests, batch):
            ids = list(range(first, min(first + batch, a.requests)))
            start, end, steps, new = run_batch([prompts[i % len(prompts)] for i in ids],
                                               a.max_tokens)
            wall += end - start
            itl = [later - earlier for earlier, later in zip(steps, steps[1:])]
            for row, _ in enumerate(ids):
                n = int(new.shape[1])
                tokens += n
                requests.append({"ttft": steps[0] - start, "itl": itl,
                                 "tokens": n,
                                 "text": tokenizer.decode(new[row], skip_special_tokens=False)})
        print("RESULT " + json.dumps({"batch": batch, "wall_s": wall, "tokens": tokens,
                                      "requests": requests, "torch": torch.__version__,
                                      "transformers": transformers.__version__,
                                      "threads": torch.get_num_threads()}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make-model")
    m.add_argument("out")
    m.add_argument("--layers", type=int, required=True)
    m.add_argument("--d-model", type=int, required=True)
    m.add_argument("--heads", type=int, required=True)
    m.add_argument("--vocab", type=int, default=50257)
    m.add_argument("--max-seq-len", type=int, default=1024)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--tokenizer-dir", required=True)
    m.add_argument("--llama", action="store_true")
    m.add_argument("--kv-heads", type=int, default=0)
    m.add_argument("--d-ff", type=int, default=0)
    g = sub.add_parser("generate")
    g.add_argument("model")
    g.add_argument("--prompts", required=True, help="a JSON list of strings")
    g.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], required=True)
    g.add_argument("--requests", type=int, required=True)
    g.add_argument("--max-tokens", type=int, required=True)
    g.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    make_model(a) if a.command == "make-model" else generate(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
