#!/usr/bin/env python3
"""Training across slow links: Shardline's data-parallel modes against PyTorch DDP, DDP + PowerSGD
and TorchFT's DiLoCo, on namespaced hosts joined by rate-limited links, in one run (issue 35).

  bench/slow_link_compare.py [BUILD_DIR] [--rates 10gbit,1gbit,100mbit] [--steps 600] [--quick]
      [--ranks-per-host 1|2] [--hosts 2] [--layers 8 --d-model 256 --heads 8 --seq 128
      --batch 16] [--modes plain,powersgd,int8,diloco50,diloco500] [--only shardline|peers]
      [--bucket-mb N] [--threads 1] [--python /opt/shardline-bench/torch2/bin/python] [--keep]

BUILD_DIR (default build-dev beside bench/) holds cli/shardline; nothing is built. Run as root: the
script makes, and removes on every way out (errors, Ctrl-C, SIGTERM), --hosts network namespaces
joined by a bridge in the root namespace, one veth pair per host, addresses 10.232.<pid % 250>.x/24
(the bridge .1, host i .(i+1)), and a `tc` token bucket (tbf) at the rate under test on both ends
of every veth: the namespace end's egress (the host's upload) and the root end's egress (its
download). This kernel has no `netem`, so there is no added latency: bandwidth alone is shaped,
and the output says so. Without `ip`/`tc`, or when the kernel refuses them, it prints
`SKIP slowlink: <why>` and exits 0.

For every rate in --rates, one run of every mode on each side (the same model, global batch,
steps, tokens and corpus everywhere):
  Shardline: one coordinator in the root namespace on the bridge's address (CURVE keys from
    `shardline keygen`), one agent per namespace (`ip netns exec NS shardline agent --devices
    cpu:R --advertise-address ADDR`, OMP/OpenBLAS threads --threads per actor), and per mode a
    train job (parallel {tp: 1, dp: hosts x R}, backend auto: shared memory inside a host, Gloo
    between hosts) with its `data_parallel:` section:
      plain     none (or {bucket_mb: N} with --bucket-mb)
      powersgd  {compression: powersgd, rank: 4}
      int8      {compression: int8}
      diloco50  {sync: diloco, every: 50, outer_lr: 0.7, outer_momentum: 0.9, fragments: 1}
      diloco500 the same with every: 500
    A build that does not know a mode's keys refuses the job at submit: that row says so.
  Peers (bench/slow_link_peer.py in PYTHON, one process per rank inside its host's namespace,
    MASTER_ADDR the first host, GLOO_SOCKET_IFNAME its veth):
      ddp       DistributedDataParallel over Gloo            (the synchronous run of this side)
      powersgd  DDP + powerSGD_hook, rank 4, start_powerSGD_iter 2
      diloco50, diloco500  torchft.local_sgd.DiLoCo, one replica group per host, the same H,
                outer lr and momentum, a torchft_lighthouse in the root namespace.
  A DiLoCo mode with every > --steps is skipped, and the output says so (H = 500 needs >= 500
  steps; --quick runs 100 steps, so only H = 50).

Measured per run:
  tokens/s     global batch x seq x (steps after the first tenth) / their wall time (Shardline:
               rank 0's log stamps; peers: the slowest rank's step ends).
  loss         the mean training loss (over the global batch) of the last tenth of the steps;
               "/ sync" is its ratio to the same side's synchronous run (Shardline plain, DDP):
               both sides read the same byte-level corpus, each draws its own windows, so each
               side is compared with its own synchronous run after the same tokens. DiLoCo's is
               the replicas' inner training loss as each side logs it (Shardline: rank 0's log
               line; peers: the mean over all ranks), not a loss of the synced model.
  wire B/step  ground truth: the bytes all hosts sent (the root ends' rx_bytes in
               /sys/class/net/<veth>/statistics, link-layer) from the first training step seen to
               the end of the run, over the steps between; includes the control plane (Shardline's
               heartbeats and step reports, TorchFT's quorum).
  metric B/step  Shardline only, from the actors' /metrics (scraped inside the namespaces every
               5 s; each actor's counter over its own shardline_actor_step, summed over actors):
               shardline_actor_network_bytes_total by group_kind and direction where the build
               exports it, else shardline_collective_bytes_total by op, labelled "buffers": bytes
               handed to collectives, not bytes on the wire; "n/a" for a run too short to scrape
               twice.
Then the targets of issue 35, PASS or MISS: at 1 Gbit Shardline plain >= 1.2x DDP plain tokens/s;
at 100 Mbit Shardline's best mode >= 1.5x the best peer's tokens/s, "best" on each side being the
fastest mode whose loss is within 2% of that side's synchronous run. Last, one line per rate:
  result slowlink rate=... shardline_plain=... ddp=... best_shardline=MODE:tok/s best_peer=...
Ranks of one host reach each other over their namespace's loopback on both sides (Shardline's
shared memory, DDP's Gloo pairs to the host's own address): unshaped and not counted. The
coordinator runs with --heartbeat-timeout-ms 20000, as a saturated link may hold a heartbeat back.
Full run: hours on 2 shared cores. Measured with the default model on a loaded 2-core EPYC: a
synchronous step takes ~1.5 s at 1 Gbit (1 rank per host) and ~3.3 s at 100 Mbit (2 per host;
each host sends ~26 MB per step, ~39 MB in DDP's flat ring of 4 ranks), so a 600-step synchronous run is 15-35
minutes and the whole matrix (9 runs per rate, 3 rates) 3-5 hours; --quick (100 steps) about a
sixth of that. Develop with --quick --rates 1gbit, or --steps 20 and a smaller model.
Not part of ctest.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from tables import print_table  # bench/tables.py: this script's folder is on sys.path
from torch_peer import VENV_PYTHON, pick_python

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)

SHARDLINE_MODES = {
    "plain": {},
    "powersgd": {"compression": "powersgd", "rank": 4},
    "int8": {"compression": "int8"},
    "diloco50": {"sync": "diloco", "every": 50, "outer_lr": 0.7, "outer_momentum": 0.9,
                 "fragments": 1},
    "diloco500": {"sync": "diloco", "every": 500, "outer_lr": 0.7, "outer_momentum": 0.9,
                  "fragments": 1},
}
PEER_MODES = {
    "ddp": {"mode": "ddp"},
    "powersgd": {"mode": "powersgd", "rank": 4, "start_iter": 2},
    "diloco50": {"mode": "diloco", "every": 50, "outer_lr": 0.7, "outer_momentum": 0.9},
    "diloco500": {"mode": "diloco", "every": 500, "outer_lr": 0.7, "outer_momentum": 0.9},
}
# Which peer modes run with which --modes names (a Shardline mode with no peer twin runs alone).
PEER_FOR = {"plain": "ddp", "powersgd": "powersgd", "diloco50": "diloco50",
            "diloco500": "diloco500"}
SYNC = {"shardline": "plain", "peer": "ddp"}
LR = 1e-3
SEED = 1


class BenchError(Exception):
    pass


class Interrupted(Exception):
    pass


def on_signal(signum, _frame):
    raise Interrupted(f"signal {signal.Signals(signum).name}")


def run(command, check=True):
    """Runs a short command (ip, tc); returns (exit status, output)."""
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)
    if check and done.returncode != 0:
        raise BenchError(f"`{' '.join(command)}` failed ({done.returncode}): {done.stdout.strip()}")
    return done.returncode, done.stdout


def rate_bits(text):
    """'10gbit' -> 10e9 (tc's units: kbit, mbit, gbit)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(kbit|mbit|gbit)", text.strip().lower())
    if m is None:
        raise argparse.ArgumentTypeError(f"--rates: {text!r} is not N(kbit|mbit|gbit)")
    return float(m[1]) * {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m[2]]


def tail(path, chars=3000):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-chars:]
    except OSError:
        return f"(no {path})"


# ------------------------------------------------------------------------------ namespaced hosts

class Hosts:
    """`count` network namespaces on a bridge, each behind a veth pair shaped by tbf."""

    def __init__(self, count):
        pid = os.getpid()
        self.prefix = f"slk{pid % 100000}"
        self.subnet = f"10.232.{pid % 250}"
        self.bridge = self.prefix + "b"
        self.count = count
        self.namespaces = []  # made so far: what remove() undoes
        self.links = []

    def netns(self, host):  # host 1..count
        return f"{self.prefix}h{host}"

    def veth(self, host):  # the root namespace's end
        return f"{self.prefix}v{host}"

    def address(self, host):  # 0: the bridge
        return f"{self.subnet}.{host + 1}"

    INSIDE = "eth0"  # the namespace's end of each veth

    def create(self):
        run(["ip", "link", "add", self.bridge, "type", "bridge"])
        self.links.append(self.bridge)
        run(["ip", "addr", "add", f"{self.address(0)}/24", "dev", self.bridge])
        run(["ip", "link", "set", self.bridge, "up"])
        for host in range(1, self.count + 1):
            ns, outside = self.netns(host), self.veth(host)
            run(["ip", "netns", "add", ns])
            self.namespaces.append(ns)
            run(["ip", "link", "add", outside, "type", "veth", "peer", "name", self.INSIDE,
                 "netns", ns])
            self.links.append(outside)
            for command in (["ip", "link", "set", outside, "master", self.bridge],
                            ["ip", "link", "set", outside, "up"],
                            ["ip", "-n", ns, "addr", "add", f"{self.address(host)}/24", "dev",
                             self.INSIDE],
                            ["ip", "-n", ns, "link", "set", self.INSIDE, "up"],
                            ["ip", "-n", ns, "link", "set", "lo", "up"]):
                run(command)

    def shape(self, bits):
        """tbf at `bits`/s on both ends of every veth (replacing the previous rate)."""
        rate_bytes = bits / 8
        # The bucket must hold what arrives in one timer tick (rate / HZ, HZ <= 1000 here) and
        # one GSO super-packet (64 KiB); the queue holds 50 ms at the rate.
        burst = int(max(256 * 1024, rate_bytes / 250))
        for host in range(1, self.count + 1):
            for prefix, dev in ((["ip", "netns", "exec", self.netns(host)], self.INSIDE),
                                ([], self.veth(host))):
                run(prefix + ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                              f"{int(bits)}bit", "burst", str(burst), "latency", "50ms"])

    def describe_shaping(self):
        _, out = run(["tc", "qdisc", "show", "dev", self.veth(1)], check=False)
        return out.strip()

    def sent_bytes(self):
        """{host: bytes that host sent onto its link} (the root end's rx counter)."""
        counts = {}
        for host in range(1, self.count + 1):
            with open(f"/sys/class/net/{self.veth(host)}/statistics/rx_bytes") as f:
                counts[host] = int(f.read())
        return counts

    def kill_inside(self):
        for ns in self.namespaces:
            _, pids = run(["ip", "netns", "pids", ns], check=False)
            for pid in pids.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass

    def remove(self):
        # Only what this run made: its namespaces (their veth ends go with them), then the bridge.
        self.kill_inside()
        for ns in self.namespaces:
            run(["ip", "netns", "del", ns], check=False)
        for link in self.links:
            run(["ip", "link", "del", link], check=False)
        self.namespaces, self.links = [], []


def preflight():
    """Why namespaces and shaping cannot be made here, or None."""
    if os.geteuid() != 0:
        return "not root (ip netns and tc need it)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` on PATH (Debian: apt install iproute2)"
    return None


# --------------------------------------------------------------------------------- the processes

class Processes:
    """Started processes, each the leader of a process group of its own."""

    def __init__(self):
        self.started = []

    def start(self, command, log_path, env=None):
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self.started.append(proc)
        return proc

    def stop(self, procs):
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.started = [p for p in self.started if p not in procs]

    def stop_all(self):
        self.stop(list(self.started))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Follower:
    """Reads the lines appended to a log file since the last call."""

    def __init__(self, path):
        self.path, self.offset, self.partial = path, 0, ""

    def lines(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        text = self.partial + data.decode(errors="replace")
        lines = text.split("\n")
        self.partial = lines.pop()
        return lines


class Window:
    """The wire counters at the first step seen and at the end."""

    def __init__(self, hosts):
        self.hosts = hosts
        self.first_step = self.first = None
        self.last_step = 0

    def step_seen(self, step):
        """`step` is the latest step done now (a batch of lines read at once: its last)."""
        if self.first is None:
            self.first, self.first_step = self.hosts.sent_bytes(), step
        self.last_step = max(self.last_step, step)

    def per_step(self, steps):
        """Bytes all hosts sent per step from the first step seen to now, or None."""
        if self.first is None or steps <= self.first_step:
            return None
        now = self.hosts.sent_bytes()
        return sum(now[h] - self.first[h] for h in now) / (steps - self.first_step)


def throughput(ends, batch, seq):
    """Tokens/s over the steps after the first tenth, from step end times (seconds)."""
    steps = len(ends)
    skip = max(1, steps // 10)
    if steps - skip < 1:
        return None
    seconds = ends[-1] - ends[skip - 1]
    return batch * seq * (steps - skip) / seconds if seconds > 0 else None


def final_loss(losses):
    """The mean of the last tenth of the losses (at least 5)."""
    k = min(len(losses), max(5, len(losses) // 10))
    return statistics.mean(losses[-k:]) if k else None


# --------------------------------------------------------------------------------------- corpus

def write_corpus(path, size, seed):
    """A learnable byte-level corpus: lines of template sentences over a small vocabulary (word
    choice a few bits, the rest determined: sums, counting, copies, agreement)."""
    rng = random.Random(seed)
    nouns = ["cat", "dog", "fox", "owl", "bird", "fish", "horse", "mouse"]
    adjectives = ["red", "small", "big", "old", "quick", "lazy", "green", "shy"]
    verbs = ["sees", "likes", "chases", "follows", "finds", "hears"]

    def sentence():
        kind = rng.randrange(5)
        if kind == 0:
            return (f"the {rng.choice(adjectives)} {rng.choice(nouns)} {rng.choice(verbs)} the "
                    f"{rng.choice(adjectives)} {rng.choice(nouns)}.")
        if kind == 1:
            a, b = rng.randrange(10), rng.randrange(10)
            return f"{a} + {b} = {a + b}."
        if kind == 2:
            start = rng.randrange(20)
            return "count " + " ".join(str(start + i) for i in range(rng.randrange(3, 7))) + "."
        if kind == 3:
            words = " ".join(rng.choice(nouns) for _ in range(rng.randrange(2, 5)))
            return f"echo {words} : {words}."
        noun, adjective = rng.choice(nouns), rng.choice(adjectives)
        return f"the {noun}s are {adjective}. the {noun} is {adjective}."

    parts, length = [], 0
    while length < size:
        line = " ".join(sentence() for _ in range(rng.randrange(2, 6))) + "\n"
        parts.append(line)
        length += len(line)
    with open(path, "w") as f:
        f.write("".join(parts)[:size])


# ------------------------------------------------------------------------------------ Shardline

class Shardline:
    """A coordinator in the root namespace and one agent per namespaced host, for the whole run."""

    def __init__(self, binary, hosts, args, work, procs):
        self.binary, self.hosts, self.args, self.work, self.procs = binary, hosts, args, work, procs
        self.keys = os.path.join(work, "keys")
        self.endpoint = None

    def curve(self):
        return ["--keys", self.keys]

    def start(self):
        subprocess.run([self.binary, "keygen", "--out", self.keys], check=True,
                       stdout=subprocess.DEVNULL, timeout=60)
        endpoint_file = os.path.join(self.work, "endpoint")
        log = os.path.join(self.work, "coordinator.log")
        # A generous heartbeat timeout: a link saturated by gradients may hold a heartbeat back.
        coordinator = self.procs.start(
            [self.binary, "coordinator", "--listen", f"tcp://{self.hosts.address(0)}:0",
             "--endpoint-file", endpoint_file, "--state-dir", os.path.join(self.work, "state"),
             "--heartbeat-timeout-ms", "20000"] + self.curve(), log)
        deadline = time.monotonic() + 30
        while not os.path.exists(endpoint_file) or not open(endpoint_file).read().strip():
            if coordinator.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the coordinator did not start:\n{tail(log)}")
            time.sleep(0.05)
        self.endpoint = open(endpoint_file).read().strip()
        env = dict(os.environ, OMP_NUM_THREADS=str(self.args.threads),
                   OPENBLAS_NUM_THREADS=str(self.args.threads))
        for host in range(1, self.hosts.count + 1):
            self.procs.start(
                ["ip", "netns", "exec", self.hosts.netns(host), self.binary, "agent",
                 "--coordinator", self.endpoint, "--devices", f"cpu:{self.args.ranks_per_host}",
                 "--node-id", f"host-{host}", "--advertise-address", self.hosts.address(host),
                 "--log-dir", self.actor_logs(host)] + self.curve(),
                os.path.join(self.work, f"agent-{host}.log"), env=env)
        deadline = time.monotonic() + 30
        while True:
            status = self.status()
            alive = [n for n in (status or {}).get("nodes", []) if n.get("state") == "alive"]
            if len(alive) == self.hosts.count:
                return
            if time.monotonic() > deadline:
                raise BenchError(f"{len(alive)} of {self.hosts.count} agents joined in 30 s:\n"
                                 f"{tail(log)}\n{tail(os.path.join(self.work, 'agent-1.log'))}")
            time.sleep(0.2)

    def actor_logs(self, host):
        return os.path.join(self.work, f"actors-{host}")

    def status(self, job=None):
        command = [self.binary, "status"] + ([job] if job else []) + \
            ["--coordinator", self.endpoint, "--json"] + self.curve()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=30)
            return json.loads(done.stdout) if done.returncode == 0 else None
        except (subprocess.TimeoutExpired, json.JSONDecodeError):
            return None

    def spec(self, name, section):
        a = self.args
        dp = a.hosts * a.ranks_per_host
        text = f"""name: {name}
kind: train
devices: cpu
backend: auto
bootstrap_timeout_s: 300
run_timeout_s: {a.run_timeout}
model: {{layers: {a.layers}, heads: {a.heads}, d_model: {a.d_model}, max_seq_len: {a.seq}}}
data: {{path: {a.corpus}}}
optimizer: {{lr: {LR}, beta1: 0.9, beta2: 0.95, eps: 1.0e-8, weight_decay: 0.0, grad_clip: 1.0, \
warmup_steps: 0}}
steps: {a.steps}
batch: {a.batch}
seq_len: {a.seq}
seed: {SEED}
log_interval: 1
parallel: {{tp: 1, dp: {dp}}}
"""
        if section:
            text += "data_parallel: {" + ", ".join(f"{k}: {v}" for k, v in section.items()) + "}\n"
        return text

    def scrape(self, actors):
        """{rank: (its shardline_actor_step, {counter: value})} from the actors' /metrics, read
        inside their namespaces (loopback there). Counters: shardline_actor_network_bytes_total
        as ("network", group_kind, direction), the bytes on the wire, where the build exports
        it; shardline_collective_bytes_total as ("buffers", op), the bytes of the buffers handed
        to collectives (not what crossed the wire)."""
        found = {}
        sample = re.compile(r"^(shardline_actor_network_bytes_total"
                            r"|shardline_collective_bytes_total|shardline_actor_step)"
                            r"(?:\{([^}]*)\})?\s+(\S+)")
        for actor in actors:
            address, node = actor.get("metrics_address"), actor.get("node_id", "")
            if not address or not node.startswith("host-"):
                continue
            try:
                done = subprocess.run(["ip", "netns", "exec", self.hosts.netns(int(node[5:])),
                                       "curl", "-s", "--max-time", "2",
                                       f"http://{address}/metrics"],
                                      capture_output=True, text=True, timeout=10)
            except subprocess.TimeoutExpired:
                continue
            step, values = None, {}
            for line in done.stdout.splitlines():
                m = sample.match(line)
                if m is None:
                    continue
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m[2] or ""))
                if m[1] == "shardline_actor_step":
                    step = float(m[3])
                    continue
                key = (("network", labels.get("group_kind", "?"), labels.get("direction", "?"))
                       if m[1] == "shardline_actor_network_bytes_total"
                       else ("buffers", labels.get("op", "?")))
                values[key] = values.get(key, 0.0) + float(m[3])
            if step is not None and values:
                found[actor["rank"]] = (step, values)
        return found

    def run_mode(self, mode, section, label):
        a = self.args
        name = f"slowlink-{label}-{mode}".replace("_", "-")[:63]
        spec_path = os.path.join(self.work, f"{name}.yaml")
        with open(spec_path, "w") as f:
            f.write(self.spec(name, section))
        submitted = subprocess.run([self.binary, "submit", spec_path, "--coordinator",
                                    self.endpoint] + self.curve(), capture_output=True, text=True,
                                   timeout=60, cwd=self.work)
        if submitted.returncode != 0 or "submitted job " not in submitted.stdout:
            why = (submitted.stdout + submitted.stderr).strip().splitlines()
            why = [line for line in why if "warning" not in line.lower()] or ["(no output)"]
            if "unknown key 'data_parallel'" in " ".join(why):
                return {"error": "this build does not know `data_parallel:` (refused at submit)"}
            return {"error": "refused at submit: " + " / ".join(why[-3:])}
        job_id = submitted.stdout.split("submitted job ", 1)[1].split()[0]
        log, follower, window = None, None, Window(self.hosts)
        step_line = re.compile(r"^(\d\d):(\d\d):(\d\d\.\d+) .*\bstep (\d+)/\d+ loss (\S+)")
        stamps, losses = {}, {}
        first_scrape, last_scrape = {}, {}  # rank: (step, counters)
        deadline = time.monotonic() + a.run_timeout + 300
        next_status = next_scrape = 0.0
        actors, state, job = [], None, {}
        last_progress, last_step = time.monotonic(), 0
        while True:
            latest = 0
            for line in follower.lines() if follower else []:
                m = step_line.match(line)
                if m:
                    step = int(m[4])
                    stamps[step] = int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3])
                    losses[step] = float(m[5])
                    latest = max(latest, step)
            if latest:
                window.step_seen(latest)
            now = time.monotonic()
            if now >= next_status:
                next_status = now + 2.0
                status = self.status(job_id)
                if status and status.get("jobs"):
                    job = status["jobs"][0]
                    state = job.get("state")
                    actors = job.get("actors", actors)
                    node = next((x.get("node_id", "") for x in actors if x.get("rank") == 0), "")
                    if follower is None and node.startswith("host-"):
                        # Rank 0's log: its step lines carry the loss over the global batch.
                        log = os.path.join(self.actor_logs(int(node[5:])),
                                           f"{job_id}.g1.rank0.log")
                        follower = Follower(log)
            if now >= next_scrape and actors and window.last_step > 0 and state == "running":
                next_scrape = now + 5.0
                for rank, seen in self.scrape(actors).items():
                    first_scrape.setdefault(rank, seen)
                    last_scrape[rank] = seen
            if state in ("succeeded", "failed", "cancelled"):
                break
            if window.last_step > last_step:
                last_progress, last_step = now, window.last_step
            elif now - last_progress > a.stall_timeout:
                subprocess.run([self.binary, "cancel", job_id, "--coordinator", self.endpoint]
                               + self.curve(), capture_output=True, timeout=30)
                return {"error": f"job {job_id} ({state}): no step for {a.stall_timeout} s after "
                                 f"step {last_step}"}
            if now > deadline:
                subprocess.run([self.binary, "cancel", job_id, "--coordinator", self.endpoint]
                               + self.curve(), capture_output=True, timeout=30)
                return {"error": f"job {job_id} not done after {a.run_timeout + 300} s"}
            time.sleep(0.05)
        if follower is None:
            return {"error": f"job {job_id} {state}, rank 0 never seen: {job.get('error', '')}"}
        for line in follower.lines():  # what the log gained before the end was seen
            m = step_line.match(line)
            if m:
                stamps[int(m[4])] = int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3])
                losses[int(m[4])] = float(m[5])
        wire = window.per_step(a.steps)
        if state != "succeeded":
            return {"error": f"job {job_id} {state}: {job.get('error', '')}"
                             f"\n{tail(log, 1500)}"}
        missing = [s for s in range(1, a.steps + 1) if s not in stamps]
        if missing:
            return {"error": f"rank 0's log {log} lacks steps {missing[:5]}..."}
        ends = [stamps[s] for s in range(1, a.steps + 1)]
        for i in range(1, len(ends)):  # past midnight
            while ends[i] < ends[i - 1] - 43200:
                ends[i] += 86400
        # Each actor's counters per step between its first and last scrape, summed over actors.
        metric = {}
        for rank, (s1, last) in last_scrape.items():
            s0, first = first_scrape[rank]
            if s1 <= s0:
                continue
            for key, value in last.items():
                metric[key] = metric.get(key, 0.0) + (value - first.get(key, 0.0)) / (s1 - s0)
        metric = metric or None
        written = ", ".join(f"{k}: {v}" for k, v in section.items())
        return {"tokens_per_s": throughput(ends, a.batch, a.seq),
                "loss": final_loss([losses[s] for s in range(1, a.steps + 1)]),
                "wire": wire, "metric": metric,
                "versions": f"shardline, dp group over {self.dp_backend(job_id)}" +
                            (f", data_parallel {{{written}}}" if section else "")}

    def dp_backend(self, job_id):
        """What the coordinator says the job's data-parallel group formed over (shm+gloo: shared
        memory inside each host, Gloo between them), or '?'."""
        ready = re.compile(rf"job {re.escape(job_id)} generation \d+: group dp-\S+ ready in "
                           rf"[\d.]+ s over (\S+)")
        found = ready.findall(tail(os.path.join(self.work, "coordinator.log"), 10**7))
        return found[-1] if found else "?"


# ----------------------------------------------------------------------------------------- peers

def run_peer(mode_name, config, hosts, args, work, procs, label):
    a = args
    run_dir = os.path.join(work, f"peer-{label}-{mode_name}")
    os.makedirs(run_dir)
    world = a.hosts * a.ranks_per_host
    command_tail = ["--mode", config["mode"], "--corpus", a.corpus, "--out", run_dir,
                    "--layers", a.layers, "--d-model", a.d_model, "--heads", a.heads,
                    "--seq", a.seq, "--batch", a.batch, "--steps", a.steps, "--seed", SEED,
                    "--lr", LR, "--threads", a.threads]
    lighthouse = None
    started = []
    base = dict(os.environ, PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME=Hosts.INSIDE,
                WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(a.ranks_per_host))
    if config["mode"] == "powersgd":
        command_tail += ["--powersgd-rank", config["rank"],
                         "--start-powersgd-iter", config["start_iter"]]
    if config["mode"] == "diloco":
        port = free_port()
        lighthouse = procs.start(
            [os.path.join(os.path.dirname(a.python), "torchft_lighthouse"), "--min_replicas",
             str(a.hosts), "--join_timeout_ms", "10000", "--quorum_tick_ms", "100",
             "--heartbeat_timeout_ms", "60000", "--bind", f"{hosts.address(0)}:{port}"],
            os.path.join(run_dir, "lighthouse.log"))
        started.append(lighthouse)
        command_tail += ["--lighthouse", f"http://{hosts.address(0)}:{port}",
                         "--every", config["every"], "--outer-lr", config["outer_lr"],
                         "--outer-momentum", config["outer_momentum"]]
    job_port = free_port()
    for host in range(1, a.hosts + 1):
        group_port = free_port()
        for local in range(a.ranks_per_host):
            rank = (host - 1) * a.ranks_per_host + local
            env = dict(base, RANK=str(rank), LOCAL_RANK=str(local))
            if config["mode"] == "diloco":
                # Each host's own store and in-host group; the Manager finds its peers through
                # the lighthouse.
                env.update(MASTER_ADDR=hosts.address(host), MASTER_PORT=str(group_port),
                           REPLICA_GROUP_ID=str(host - 1), NUM_REPLICA_GROUPS=str(a.hosts))
            else:
                env.update(MASTER_ADDR=hosts.address(1), MASTER_PORT=str(job_port))
            command = ["ip", "netns", "exec", hosts.netns(host), a.python,
                       os.path.join(HERE, "slow_link_peer.py")] + [str(c) for c in command_tail]
            started.append(procs.start(command, os.path.join(run_dir, f"rank{rank}.log"),
                                       env=env))
    ranks = [p for p in started if p is not lighthouse]
    follower, window = Follower(os.path.join(run_dir, "rank0.log")), Window(hosts)
    step_line = re.compile(r"^step (\d+) loss")
    deadline = time.monotonic() + a.run_timeout
    last_progress, last_step = time.monotonic(), 0
    try:
        while any(p.poll() is None for p in ranks):
            steps = [int(m[1]) for m in map(step_line.match, follower.lines()) if m]
            if steps:
                window.step_seen(max(steps))
            if window.last_step > last_step:
                last_progress, last_step = time.monotonic(), window.last_step
            elif time.monotonic() - last_progress > a.stall_timeout:
                raise BenchError(f"no step for {a.stall_timeout} s after step {last_step}:\n"
                                 + "".join(f"--- rank {i}:\n"
                                           f"{tail(os.path.join(run_dir, f'rank{i}.log'), 1500)}\n"
                                           for i in range(len(ranks))))
            failed = [p for p in ranks if p.poll() not in (None, 0)]
            if failed:
                time.sleep(2)  # let the others write why they stopped too
                i = ranks.index(failed[0])
                raise BenchError(f"rank {i} exited with {failed[0].returncode}:\n"
                                 f"{tail(os.path.join(run_dir, f'rank{i}.log'), 2000)}")
            if time.monotonic() > deadline:
                raise BenchError(f"still running after {a.run_timeout} s")
            if lighthouse is not None and lighthouse.poll() is not None:
                raise BenchError(f"torchft_lighthouse exited with {lighthouse.returncode}:\n"
                                 f"{tail(os.path.join(run_dir, 'lighthouse.log'))}")
            time.sleep(0.05)
        steps = [int(m[1]) for m in map(step_line.match, follower.lines()) if m]
        if steps:
            window.step_seen(max(steps))
        wire = window.per_step(a.steps)
    except BenchError as e:
        return {"error": str(e)}
    finally:
        procs.stop(started)
    results = []
    for rank in range(world):
        path = os.path.join(run_dir, f"rank{rank}.json")
        try:
            with open(path) as f:
                results.append(json.load(f))
        except (OSError, json.JSONDecodeError) as e:
            return {"error": f"rank {rank} left no result ({e}):\n"
                             f"{tail(os.path.join(run_dir, f'rank{rank}.log'), 2000)}"}
    # The slowest rank's wall time; the loss of a step is the mean over the ranks' slices (each
    # slice the same size), i.e. over the global batch.
    rates = [throughput(r["ends"], a.batch, a.seq) for r in results]
    per_step = [statistics.mean(r["losses"][s] for r in results) for s in range(a.steps)]
    return {"tokens_per_s": min(rates) if None not in rates else None,
            "loss": final_loss(per_step), "wire": wire, "metric": None,
            "versions": f"torch {results[0]['torch']}" + {
                "diloco": f", torchft {results[0]['torchft']}, H {config.get('every')}",
                "powersgd": f", powerSGD_hook rank {config.get('rank')}, start_powerSGD_iter "
                            f"{config.get('start_iter')}",
            }.get(config["mode"], "")}


# ---------------------------------------------------------------------------------------- report

def human_bytes(n):
    if n is None:
        return "n/a"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def metric_cell(metric):
    """The actors' network byte counters per step, else the collectives' buffer bytes."""
    if not metric:
        return "n/a"
    network = sorted((k, v) for k, v in metric.items() if k[0] == "network")
    if network:
        return ", ".join(f"{kind} {direction} {human_bytes(v)}" for (_, kind, direction), v
                         in network)
    return "no network counter; buffers " + ", ".join(
        f"{op} {human_bytes(v)}" for (_, op), v in sorted(metric.items()) if v > 0)


def best(results, side):
    """(mode, tokens/s) of the fastest run of `side` whose loss is within 2% of its sync run."""
    sync = results.get((side, SYNC[side]))
    if not sync or "error" in sync or sync.get("loss") is None:
        return None
    good = [(r["tokens_per_s"], mode) for (s, mode), r in results.items()
            if s == side and "error" not in r and r.get("tokens_per_s") and r.get("loss")
            and r["loss"] <= sync["loss"] * 1.02]
    if not good:
        return None
    rate, mode = max(good)
    return mode, rate


def report(rate_name, results, args):
    rows = []
    for (side, mode), r in results.items():
        name = "Shardline" if side == "shardline" else "PyTorch"
        if "skipped" in r:
            rows.append([name, mode, "skipped", "", "", "", "", r["skipped"]])
            continue
        if "error" in r:
            rows.append([name, mode, "FAILED", "", "", "", "", r["error"].splitlines()[0][:120]])
            continue
        sync = results.get((side, SYNC[side]), {})
        ratio = (f"{r['loss'] / sync['loss']:.3f}" if sync.get("loss") and r.get("loss")
                 else "n/a")
        versions = r.get("versions", "")
        rows.append([name, mode, f"{r['tokens_per_s']:.0f}" if r["tokens_per_s"] else "n/a",
                     f"{r['loss']:.4f}", ratio, human_bytes(r["wire"]),
                     metric_cell(r["metric"]) if side == "shardline" else "-", versions])
    print(f"\n## {rate_name} (tbf both directions on every veth, no added latency)")
    print_table(["side", "mode", "tokens/s", "loss", "loss / sync", "wire B/step (veth)",
                 "metric B/step (actors)", "versions / note"], rows)


def targets(all_results):
    lines = []
    one = all_results.get("1gbit")
    if one:
        ours, theirs = one.get(("shardline", "plain"), {}), one.get(("peer", "ddp"), {})
        if ours.get("tokens_per_s") and theirs.get("tokens_per_s"):
            ratio = ours["tokens_per_s"] / theirs["tokens_per_s"]
            lines.append(f"target 1 Gbit: Shardline plain {ours['tokens_per_s']:.0f} tok/s / DDP "
                         f"plain {theirs['tokens_per_s']:.0f} tok/s = {ratio:.2f}x (>= 1.2x): "
                         f"{'PASS' if ratio >= 1.2 else 'MISS'}")
        else:
            lines.append("target 1 Gbit: MISS (Shardline plain or DDP plain has no figure)")
    else:
        lines.append("target 1 Gbit: not run (1gbit not in --rates)")
    slow = all_results.get("100mbit")
    if slow:
        ours, theirs = best(slow, "shardline"), best(slow, "peer")
        if ours and theirs:
            ratio = ours[1] / theirs[1]
            lines.append(f"target 100 Mbit: Shardline's best within 2% of its sync loss, "
                         f"{ours[0]} {ours[1]:.0f} tok/s / the best peer's, {theirs[0]} "
                         f"{theirs[1]:.0f} tok/s = {ratio:.2f}x (>= 1.5x): "
                         f"{'PASS' if ratio >= 1.5 else 'MISS'}")
        else:
            lines.append(f"target 100 Mbit: MISS (no qualifying run: Shardline {ours}, "
                         f"peers {theirs})")
    else:
        lines.append("target 100 Mbit: not run (100mbit not in --rates)")
    return lines


def cpu_line():
    model = "?"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        model = next((l.split(":", 1)[1].strip() for l in out.splitlines()
                      if l.startswith("Model name")), "?")
    except OSError:
        pass
    with open("/proc/cpuinfo") as f:
        avx512 = " avx512f " in f.read().replace("\n", " ")
    return f"{model}, {os.cpu_count()} cores, avx512f {'yes' if avx512 else 'no'}"


def torchft_version(python):
    """torchft's version where `python` imports it and its torchft_lighthouse is beside it."""
    done = subprocess.run([python, "-c", "import importlib.metadata as m, torchft; "
                           "print(m.version('torchft'))"], capture_output=True, text=True,
                          timeout=120)
    lighthouse = os.path.join(os.path.dirname(python), "torchft_lighthouse")
    return done.stdout.strip() if done.returncode == 0 and os.access(lighthouse, os.X_OK) \
        else None


# ---------------------------------------------------------------------------------------- driver

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("build_dir", nargs="?", default=os.path.join(SOURCE, "build-dev"))
    p.add_argument("--rates", default="10gbit,1gbit,100mbit")
    p.add_argument("--steps", type=int, default=None, help="default 600 (100 with --quick)")
    p.add_argument("--quick", action="store_true", help="100 steps (DiLoCo H = 500 skipped)")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--ranks-per-host", type=int, choices=(1, 2), default=1)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=16, help="the global batch (sequences per step)")
    p.add_argument("--threads", type=int, default=1, help="threads per rank, both sides")
    p.add_argument("--modes", default="plain,powersgd,int8,diloco50,diloco500",
                   help="Shardline's modes; each runs with its peer twin (plain: ddp)")
    p.add_argument("--only", choices=("shardline", "peers"))
    p.add_argument("--bucket-mb", type=float, default=None,
                   help="data_parallel.bucket_mb for every Shardline mode")
    p.add_argument("--python", default=None, help=f"the peers' Python (default {VENV_PYTHON})")
    p.add_argument("--run-timeout", type=int, default=7200, help="seconds per run")
    p.add_argument("--stall-timeout", type=int, default=600,
                   help="a run with no new step for this long (start-up included) fails")
    p.add_argument("--corpus-bytes", type=int, default=4 << 20)
    p.add_argument("--keep", action="store_true", help="keep the work folder (logs, specs)")
    a = p.parse_args()
    if a.steps is None:
        a.steps = 100 if a.quick else 600
    if a.steps < 2:
        sys.exit(f"slow_link_compare: --steps {a.steps}: at least 2")
    try:
        rates = [(name.strip().lower(), rate_bits(name)) for name in a.rates.split(",")]
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in SHARDLINE_MODES]
    if unknown:
        sys.exit(f"slow_link_compare: --modes: unknown {unknown}; known {list(SHARDLINE_MODES)}")
    if a.batch % (a.hosts * a.ranks_per_host) != 0:
        sys.exit(f"slow_link_compare: --batch {a.batch} is not divisible by hosts x ranks per "
                 f"host = {a.hosts * a.ranks_per_host}")
    binary = os.path.join(os.path.abspath(a.build_dir), "cli", "shardline")
    if a.only != "peers" and not os.access(binary, os.X_OK):
        sys.exit(f"slow_link_compare: no {binary} (build it: ninja -C {a.build_dir} shardline)")
    why = preflight()
    if why:
        print(f"SKIP slowlink: {why}")
        return 0
    torchft = None
    if a.only != "shardline":
        a.python, torch_version, origin = pick_python(a.python, "slow_link_compare",
                                                      need_gloo=True)
        torchft = torchft_version(a.python)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    work = tempfile.mkdtemp(prefix="shardline-slowlink-")
    a.corpus = os.path.join(work, "corpus.txt")
    write_corpus(a.corpus, a.corpus_bytes, SEED)
    hosts = Hosts(a.hosts)
    procs = Processes()
    all_results = {}
    try:
        try:
            hosts.create()
            hosts.shape(rates[0][1])
        except BenchError as e:
            print(f"SKIP slowlink: cannot make shaped namespaced hosts here: {e}")
            return 0
        print(f"# slowlink: {a.hosts} namespaced hosts x {a.ranks_per_host} rank(s), bridge "
              f"{hosts.bridge} {hosts.address(0)}/24, tbf on both ends of every veth "
              f"(upload and download); no netem on this kernel: bandwidth only, no added "
              f"latency")
        print(f"# shaping, e.g.: {hosts.describe_shaping()}")
        print(f"# CPU: {cpu_line()}; {a.threads} thread(s) per rank on both sides")
        print(f"# model: GPT layers={a.layers} d_model={a.d_model} heads={a.heads} vocab=257 "
              f"seq={a.seq}, global batch {a.batch}, {a.steps} steps ({a.batch * a.seq} "
              f"tokens/step), AdamW lr {LR} betas 0.9/0.95 wd 0, clip 1.0; corpus: "
              f"{a.corpus_bytes} bytes of template sentences ({a.corpus})")
        if a.only != "shardline":
            print(f"# peers: {a.python} ({origin}), torch {torch_version}, torchft "
                  f"{torchft or 'not installed (bench/setup-torchft.sh): DiLoCo peers skipped'}")
        shardline = None
        if a.only != "peers":
            shardline = Shardline(binary, hosts, a, work, procs)
            shardline.start()
            print(f"# shardline: {binary}, coordinator {shardline.endpoint} (root namespace), "
                  f"agents host-1..{a.hosts} in the namespaces")
        for rate_name, bits in rates:
            hosts.shape(bits)
            results = {}
            for mode in modes:
                section = dict(SHARDLINE_MODES[mode])
                every = section.get("every")
                too_few = every is not None and every > a.steps
                if shardline is not None:
                    if too_few:
                        results[("shardline", mode)] = {
                            "skipped": f"every {every} > {a.steps} steps"}
                    else:
                        if a.bucket_mb is not None:
                            section["bucket_mb"] = a.bucket_mb
                        began = time.monotonic()
                        r = shardline.run_mode(mode, section, rate_name)
                        results[("shardline", mode)] = r
                        print(f"  {rate_name} shardline {mode}: "
                              f"{summary(r)} ({time.monotonic() - began:.0f} s)", flush=True)
                peer = PEER_FOR.get(mode)
                if peer is None or a.only == "shardline":
                    continue
                config = PEER_MODES[peer]
                if too_few:
                    results[("peer", peer)] = {"skipped": f"every {every} > {a.steps} steps"}
                elif config["mode"] == "diloco" and torchft is None:
                    results[("peer", peer)] = {"skipped": "no torchft (bench/setup-torchft.sh)"}
                else:
                    began = time.monotonic()
                    r = run_peer(peer, config, hosts, a, work, procs, rate_name)
                    results[("peer", peer)] = r
                    print(f"  {rate_name} pytorch {peer}: {summary(r)} "
                          f"({time.monotonic() - began:.0f} s)", flush=True)
            all_results[rate_name] = results
            report(rate_name, results, a)
        print()
        for line in targets(all_results):
            print(line)
        for rate_name, results in all_results.items():
            def fig(key):
                r = results.get(key, {})
                return f"{r['tokens_per_s']:.0f}" if r.get("tokens_per_s") else "n/a"
            ours, theirs = best(results, "shardline"), best(results, "peer")
            print(f"result slowlink rate={rate_name} ranks_per_host={a.ranks_per_host} "
                  f"steps={a.steps} shardline_plain={fig(('shardline', 'plain'))} "
                  f"ddp={fig(('peer', 'ddp'))} "
                  f"best_shardline={f'{ours[0]}:{ours[1]:.0f}' if ours else 'n/a'} "
                  f"best_peer={f'{theirs[0]}:{theirs[1]:.0f}' if theirs else 'n/a'} "
                  f"torchft={torchft or 'n/a'}")
    except (BenchError, Interrupted, OSError, subprocess.SubprocessError) as e:
        print(f"slow_link_compare: stopped: {type(e).__name__}: {e}", flush=True)
        return 1
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)  # cleanup runs to its end
        procs.stop_all()
        hosts.remove()
        if a.keep:
            print(f"# kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def summary(r):
    if "error" in r:
        return "FAILED: " + r["error"]
    if r.get("tokens_per_s") is None or r.get("loss") is None:
        return f"no figure: {r}"
    return (f"{r['tokens_per_s']:.0f} tok/s, loss {r['loss']:.4f}, wire "
            f"{human_bytes(r['wire'])}/step, metric {metric_cell(r.get('metric'))}")


if __name__ == "__main__":
    sys.exit(main())
