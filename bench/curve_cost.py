#!/usr/bin/env python3
"""The control-plane cost of CURVE: the same 4-actor job with CURVE (the default) and with
--insecure, in one run, rounds alternating between the two.

Per round and mode: a fresh coordinator and one agent (`--devices cpu:4`) on loopback, the keys of
`shardline keygen` (or --insecure everywhere), then `shardline submit --wait` of a comm-check job of
4 actors (all nine operations, 4 B to 1 MiB, 2 iterations: examples/comm-check-small.yaml's sizes
with every op). Measured:
  - register: agent start -> its node alive in `shardline status --json` (the agent's first
    handshake and registration, and the status client's);
  - bootstrap: the coordinator's shardline_bootstrap_seconds{group_kind="world"} (first member's
    Assignment -> the group's last CommReady: actors' registrations, key-value store traffic);
  - job: the job's submission to its end, by the coordinator's clock (spawn, bootstrap, the
    check, the reports).
The data plane (shared memory between the actors) is the same in both modes; only the
coordinator's sockets differ.

  bench/curve_cost.py [BUILD_DIR] [--rounds 5] [--keep]

Prints each round, the medians, and
  result curve_cost register_ratio=... bootstrap_ratio=... job_ratio=... zmq=4.x
where a ratio is CURVE's median over --insecure's (1.03: CURVE costs 3%). Not part of ctest.
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

JOB = """name: curve-cost
kind: comm-check
actors: 4
devices: cpu
comm_check:
  max_bytes: 1MiB
  iterations: 2
"""


def wait_until(what, check, timeout, log=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.01)
    tail = open(log).read()[-3000:] if log and os.path.exists(log) else ""
    raise RuntimeError(f"{what} did not happen within {timeout} s\n{tail}")


def one_round(binary, work, secure):
    os.makedirs(work)
    flags = ["--insecure"]
    if secure:
        keys = os.path.join(work, "keys")
        subprocess.run([binary, "keygen", "--out", keys], check=True, stdout=subprocess.DEVNULL)
        flags = ["--keys", keys]
    procs = []

    def start(argv, log):
        out = open(log, "w")
        procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        return procs[-1]

    try:
        coordinator_log = os.path.join(work, "coordinator.log")
        endpoint_file = os.path.join(work, "endpoint")
        start([binary, "coordinator", "--listen", "tcp://127.0.0.1:0", "--endpoint-file",
               endpoint_file, "--metrics", "127.0.0.1:0"] + flags, coordinator_log)
        wait_until("the coordinator's endpoint", lambda: os.path.exists(endpoint_file), 20,
                   coordinator_log)
        endpoint = open(endpoint_file).read().strip()
        metrics = wait_until("the coordinator's metrics address",
                             lambda: re.search(r"metrics on ([0-9.:]+)",
                                               open(coordinator_log).read()), 20,
                             coordinator_log).group(1)
        client = ["--coordinator", endpoint] + flags

        def node_alive():
            out = subprocess.run([binary, "status", "--json"] + client, capture_output=True,
                                 text=True)
            if out.returncode != 0:
                return False
            nodes = json.loads(out.stdout).get("nodes", [])
            return any(n.get("state") == "alive" for n in nodes)

        began = time.monotonic()
        start([binary, "agent", "--devices", "cpu:4", "--node-id", "bench", "--metrics",
               "127.0.0.1:0", "--log-dir", os.path.join(work, "actors")] + client,
              os.path.join(work, "agent.log"))
        wait_until("the node's registration", node_alive, 30, os.path.join(work, "agent.log"))
        register = time.monotonic() - began

        spec = os.path.join(work, "job.yaml")
        with open(spec, "w") as f:
            f.write(JOB)
        done = subprocess.run([binary, "submit", spec, "--wait"] + client, capture_output=True,
                              text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"the job failed:\n{done.stdout}{done.stderr}")
        # The coordinator's own clock, submission to end: `submit --wait` polls, which would
        # round the time to its poll interval.
        jobs = json.loads(subprocess.run([binary, "status", "--json"] + client, check=True,
                                         capture_output=True, text=True).stdout)["jobs"]
        job = (jobs[0]["finished_unix_ms"] - jobs[0]["submitted_unix_ms"]) / 1000.0
        exposition = subprocess.run(["curl", "-s", f"http://{metrics}/metrics"],
                                    capture_output=True, text=True, check=True).stdout
        sums = {}
        for name in ("sum", "count"):
            m = re.search(r'shardline_bootstrap_seconds_' + name +
                          r'\{[^}]*group_kind="world"[^}]*\} ([0-9.e+-]+)', exposition)
            sums[name] = float(m.group(1)) if m else 0.0
        if sums["count"] != 1:
            raise RuntimeError(f"expected one world bootstrap, saw {sums['count']}")
        return {"register": register, "bootstrap": sums["sum"], "job": job}
    finally:
        for proc in reversed(procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in reversed(procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build_dir", nargs="?", default="build")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    binary = os.path.join(args.build_dir, "cli", "shardline")
    if not os.access(binary, os.X_OK):
        sys.exit(f"no shardline binary at {binary}: build first")
    work = tempfile.mkdtemp(prefix="curve-cost-")
    results = {"curve": [], "insecure": []}
    try:
        for r in range(args.rounds):
            # Alternate which goes first, so neither always runs on a warmer machine.
            order = ["curve", "insecure"] if r % 2 == 0 else ["insecure", "curve"]
            for mode in order:
                row = one_round(binary, os.path.join(work, f"{r}-{mode}"), mode == "curve")
                results[mode].append(row)
                print(f"round {r} {mode:8s} register {row['register'] * 1000:7.1f} ms  "
                      f"bootstrap {row['bootstrap'] * 1000:7.1f} ms  job {row['job']:6.2f} s",
                      flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    med = {mode: {k: statistics.median(row[k] for row in rows) for k in rows[0]}
           for mode, rows in results.items()}
    for mode in ("curve", "insecure"):
        m = med[mode]
        print(f"median {mode:8s} register {m['register'] * 1000:7.1f} ms  bootstrap "
              f"{m['bootstrap'] * 1000:7.1f} ms  job {m['job']:6.2f} s")
    zmq = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "libzmq5"], capture_output=True,
                         text=True).stdout or "unknown"
    ratios = " ".join(f"{k}_ratio={med['curve'][k] / med['insecure'][k]:.3f}"
                      for k in ("register", "bootstrap", "job"))
    print(f"result curve_cost {ratios} rounds={args.rounds} zmq={zmq}")


if __name__ == "__main__":
    main()
