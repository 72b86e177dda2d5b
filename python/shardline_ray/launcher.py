"""`python -m shardline_ray SPEC.yaml`: a Shardline job on the Ray cluster this runs in.

    ray job submit -- python -m shardline_ray examples/gpt-sharded.yaml

1. reads the spec's device count (spec.py) and reserves a placement group with a bundle per
   device, saying what it waits for while Ray cannot give it;
2. makes the run's CURVE keys (`shardline keygen`, a 0700 temp dir of this driver);
3. starts the coordinator in an actor on the head node and one agent per node in an actor pinned
   to that node's bundles (daemons.py), handing each the key files it needs as bytes;
4. submits the job with `shardline submit --wait` and prints its progress as it comes; its exit
   status is the job's (0 succeeded, 1 failed; 130 interrupted);
5. on every way out cancels the job if it still runs, stops the daemons, kills the actors, removes
   the placement group and the keys.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Optional

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import shardline_ray
from shardline_ray import daemons, placement, processes
from shardline_ray.spec import JobShape, SpecError, read_job_shape, resolve_checkpoint_dir


class LaunchError(RuntimeError):
    """Something the launcher cannot go on without; the message says what."""


def say(line: str) -> None:
    print(f"shardline-ray: {line}", flush=True)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m shardline_ray",
        description="Run a Shardline job on the Ray cluster: a placement group with a bundle "
        "per device, the coordinator on the head node, one agent per node, the job submitted "
        "and followed to its end (exit status: the job's).")
    p.add_argument("spec", help="the job spec (YAML), as for `shardline submit`")
    p.add_argument("--address", default=None,
                   help="the Ray cluster (default: $RAY_ADDRESS, which `ray job submit` sets, "
                   "else the local cluster: auto)")
    p.add_argument("--shardline-binary", default=os.environ.get("SHARDLINE_BINARY", "shardline"),
                   help="the shardline binary, at this path (or on PATH) on every node "
                   "(default: $SHARDLINE_BINARY, else `shardline`)")
    p.add_argument("--devices", type=int, default=0,
                   help="bundles (devices) to reserve; default the job's most (its world, or "
                   "elastic max_actors; for an elastic job on a smaller Ray cluster as many as "
                   "the cluster has, but at least min_actors)")
    p.add_argument("--cpus-per-device", type=int, default=1,
                   help="Ray CPUs in each bundle: a CPU device's threads, or a GPU's host cores")
    p.add_argument("--strategy", default="PACK", type=str.upper, choices=placement.STRATEGIES,
                   help="placement group strategy (default PACK: a job's devices on as few nodes "
                   "as hold them, so tensor-parallel groups stay inside a node, on shared "
                   "memory; SPREAD: one device per node where it can, so that a lost node "
                   "takes fewer devices)")
    p.add_argument("--placement-timeout-s", type=float, default=300,
                   help="how long to wait for Ray to give the placement group (default 300)")
    p.add_argument("--work-dir", default=None,
                   help="where the spec's relative checkpoint/init paths resolve, as the "
                   "directory `shardline submit` runs in (default: the current one). On several "
                   "hosts it must be shared storage every node sees at the same path")
    p.add_argument("--timeout-s", type=int, default=0,
                   help="give up following the job after this long (default 0: until it ends; "
                   "a train job's run_timeout_s bounds it)")
    p.add_argument("--agent-max-restarts", type=int, default=-1,
                   help="how often Ray may restart an agent's actor (default -1: always, so that "
                   "a node that returns registers again and an elastic job grows back)")
    p.add_argument("--heartbeat-timeout-ms", type=int, default=1500,
                   help="the coordinator's node heartbeat timeout (default 1500)")
    p.add_argument("--connect-timeout-s", type=float, default=60,
                   help="how long an agent tries its first registration (default 60)")
    p.add_argument("--start-timeout-s", type=float, default=120,
                   help="how long the daemons' actors may take to start (default 120)")
    p.add_argument("--log-level", default="info", help="the daemons' log level (default info)")
    p.add_argument("--result-json", default=None,
                   help="write the job's final record (`shardline status JOB --json`) here")
    args = p.parse_args(argv)
    if args.cpus_per_device < 1:
        p.error("--cpus-per-device must be at least 1")
    if args.devices < 0:
        p.error("--devices must be positive")
    return args


def resolve_binary(name: str) -> str:
    path = shutil.which(name) if os.path.basename(name) == name else name
    if not path or not os.access(path, os.X_OK):
        raise LaunchError(f"no shardline binary at {name!r} (give --shardline-binary PATH or set "
                          "$SHARDLINE_BINARY; it must be at that path on every node)")
    return os.path.abspath(path)


class _Interrupted(KeyboardInterrupt):
    pass


def _on_sigterm(signum, frame) -> None:
    # `ray job stop` sends SIGTERM: treat it as Ctrl-C so that the same cleanup runs.
    raise _Interrupted()


class Launch:
    """One run: what it started, so that cleanup() stops exactly that, whatever happened."""

    def __init__(self, args: argparse.Namespace, shape: JobShape, binary: str):
        self.args = args
        self.shape = shape
        self.binary = binary
        self.spec_path = os.path.abspath(args.spec)
        self.work_dir = os.path.abspath(args.work_dir or os.getcwd())
        self.run_id = f"{shape.name}-{os.getpid()}-{int(time.time())}"
        self.key_root: Optional[str] = None
        self.pg = None
        self.coordinator = None
        self.agents: list = []
        self.holders: list = []
        self.endpoint = ""
        self.job_id = ""
        self.job_ended = False
        self.submit: Optional[subprocess.Popen] = None

    # ---- the steps -------------------------------------------------------------------------

    def connect(self) -> None:
        address = self.args.address or os.environ.get("RAY_ADDRESS") or "auto"
        # The package travels with the job (py_modules): worker nodes need Ray and the shardline
        # binary, not this tree.
        package = os.path.dirname(os.path.abspath(shardline_ray.__file__))
        try:
            ray.init(address=address, runtime_env={"py_modules": [package]},
                     logging_level="WARNING")
        except ValueError as e:
            if "runtime env" not in str(e):
                raise
            # The job's own runtime_env already names py_modules: it must hold this package.
            ray.init(address=address, logging_level="WARNING")
        except ConnectionError as e:
            raise LaunchError(f"no Ray cluster at {address}: {e}") from e
        total = ray.cluster_resources()
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        say(f"Ray cluster: {len(nodes)} node{'s' if len(nodes) != 1 else ''}, "
            f"{total.get('CPU', 0):g} CPU, {total.get('GPU', 0):g} GPU")

    def device_count(self) -> int:
        shape, args = self.shape, self.args
        if args.devices or not shape.elastic:
            return shape.max_devices
        # An elastic job runs on min..max devices: on a smaller cluster, reserve what it has.
        total = ray.cluster_resources()
        if shape.device_kind == "cuda":
            have = int(min(total.get("GPU", 0), total.get("CPU", 0) // args.cpus_per_device))
        else:
            have = int(total.get("CPU", 0) // args.cpus_per_device)
        count = max(shape.min_devices, min(shape.max_devices, have))
        if count < shape.max_devices:
            say(f"the Ray cluster holds {have} of the job's {shape.max_devices} "
                f"{shape.device_kind} devices: reserving {count} (elastic: min "
                f"{shape.min_devices}); the job will not grow past them")
        return count

    def make_keys(self) -> str:
        self.key_root = processes.private_dir("shardline-ray-keys-")
        keys = os.path.join(self.key_root, "keys")
        result = subprocess.run([self.binary, "keygen", "--out", keys], capture_output=True,
                                text=True, timeout=60)
        if result.returncode != 0:
            raise LaunchError(f"shardline keygen failed: {result.stderr.strip()}")
        return keys

    def reserve(self, count: int) -> None:
        bundles = placement.device_bundles(self.shape.device_kind, count,
                                           self.args.cpus_per_device)
        say(f"reserving a placement group of {count} bundle{'s' if count != 1 else ''} "
            f"({self.args.strategy}), one per {self.shape.device_kind} device")
        self.pg = placement.reserve(bundles, self.args.strategy, f"shardline-{self.run_id}",
                                    self.args.placement_timeout_s, say)

    def start_daemons(self, keys: str) -> None:
        args = self.args
        # On the head node: the node every Ray cluster has, where `ray job submit` runs us too.
        coordinator_class = ray.remote(daemons.CoordinatorDaemon).options(
            num_cpus=0, resources={"node:__internal_head__": 0.001}, max_restarts=0,
            name=f"shardline-coordinator-{self.run_id}")
        self.coordinator = coordinator_class.remote(
            self.binary, processes.read_keys(keys, daemons.COORDINATOR_KEYS), self.run_id,
            args.log_level, args.heartbeat_timeout_ms)
        try:
            info = ray.get(self.coordinator.info.remote(), timeout=args.start_timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            raise LaunchError(f"the coordinator's actor did not start within "
                              f"{args.start_timeout_s:g} s (is the head node's Ray busy?)") from e
        except ray.exceptions.RayActorError as e:
            raise LaunchError(f"the coordinator did not start: {e}") from e
        self.endpoint = info["endpoint"]
        say(f"coordinator {self.endpoint} on the head node (log {info['log']}); watch it: "
            f"shardline status --coordinator {self.endpoint} --keys {keys}")

        agent_keys = processes.read_keys(keys, daemons.AGENT_KEYS)
        per_device = {"num_cpus": args.cpus_per_device,
                      "num_gpus": 1 if self.shape.device_kind == "cuda" else 0}
        for bundles in placement.bundles_by_node(self.pg).values():
            anchor = bundles[0]
            if self.shape.device_kind == "cuda":
                for bundle in bundles[1:]:
                    self.holders.append(ray.remote(daemons.DeviceHolder).options(
                        **per_device, max_restarts=-1,
                        name=daemons.holder_name(self.run_id, bundle),
                        scheduling_strategy=PlacementGroupSchedulingStrategy(
                            self.pg, placement_group_bundle_index=bundle)).remote())
            agent = ray.remote(daemons.AgentDaemon).options(
                **per_device, max_restarts=args.agent_max_restarts, max_task_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.pg, placement_group_bundle_index=anchor)).remote(
                self.binary, self.endpoint, agent_keys, self.pg, anchor, bundles,
                self.shape.device_kind, args.cpus_per_device, self.run_id, args.log_level,
                args.connect_timeout_s)
            self.agents.append(agent)
        try:
            infos = ray.get([a.info.remote() for a in self.agents], timeout=args.start_timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            raise LaunchError(f"the agents' actors did not start within "
                              f"{args.start_timeout_s:g} s") from e
        except ray.exceptions.RayActorError as e:
            raise LaunchError(f"an agent did not start: {e}") from e
        for info in infos:
            say(f"agent {info['node_id']} at {info['ip']}: {info['devices']} (log {info['log']})")
        self._wait_for_registration([info["node_id"] for info in infos], keys)

    def _wait_for_registration(self, node_ids: list[str], keys: str) -> None:
        """Until the coordinator lists every agent alive: a job submitted earlier would start on
        the devices of the first to register (and, if elastic, grow at its first commit)."""
        deadline = time.monotonic() + self.args.connect_timeout_s
        alive: set[str] = set()
        while True:
            result = subprocess.run(
                [self.binary, "status", "--json", "--coordinator", self.endpoint, "--keys", keys],
                capture_output=True, text=True, timeout=30)
            if result.returncode == 0:
                alive = {n["node_id"] for n in json.loads(result.stdout)["nodes"]
                         if n["state"] == "alive"}
                if alive >= set(node_ids):
                    return
            if time.monotonic() > deadline:
                missing = sorted(set(node_ids) - alive)
                raise LaunchError(f"agents {', '.join(missing)} did not register with the "
                                  f"coordinator within {self.args.connect_timeout_s:g} s (see "
                                  "their logs above)")
            time.sleep(0.2)

    def follow(self) -> int:
        """Submits the job and prints its progress; returns `shardline submit --wait`'s status."""
        checkpoints = resolve_checkpoint_dir(self.shape, self.work_dir)
        if checkpoints:
            say(f"checkpoints in {checkpoints} (every node writes its shards there: shared "
                "storage on a cluster of several hosts)")
            if "runtime_resources" in checkpoints.split(os.sep):
                say("warning: that is inside the copy Ray made of `ray job submit --working-dir`, "
                    "which goes with the session: give --work-dir or an absolute checkpoint.dir")
        argv = [self.binary, "submit", self.spec_path, "--wait", "--wait-timeout-s",
                str(self.args.timeout_s or 10 * 365 * 86400), "--coordinator", self.endpoint,
                "--keys", os.path.join(self.key_root or "", "keys")]
        parent = os.getpid()
        self.submit = subprocess.Popen(argv, cwd=self.work_dir, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, bufsize=1,
                                       preexec_fn=lambda: processes.die_with(parent))
        assert self.submit.stdout is not None
        for line in self.submit.stdout:
            print(line, end="", flush=True)
            found = re.match(r"submitted job (\S+)", line)
            if found:
                self.job_id = found.group(1)
        status = self.submit.wait()
        if self.job_id and status in (0, 1):
            self._report()
        return status

    def _report(self) -> None:
        """One line with the job's end (the loss unrounded), and --result-json's record. A job
        that has not ended (`submit --wait` gave up: --timeout-s) is left for cleanup() to
        cancel."""
        result = subprocess.run(
            [self.binary, "status", self.job_id, "--json", "--coordinator", self.endpoint,
             "--keys", os.path.join(self.key_root or "", "keys")],
            capture_output=True, text=True, timeout=30, cwd=self.work_dir)
        if result.returncode != 0:
            say(f"warning: could not read job {self.job_id}'s final status: "
                f"{result.stderr.strip()}")
            return
        job = json.loads(result.stdout)["jobs"][0]
        self.job_ended = job["state"] in ("succeeded", "failed", "cancelled")
        train = job.get("train") or {}
        line = f"job {self.job_id} {job['state']}"
        if train:
            line += (f" at step {train['step']}/{train['steps']}, loss {train['loss']!r}, "
                     f"{len(train.get('generations', []))} generation(s)")
        say(line)
        if self.args.result_json:
            with open(self.args.result_json, "w", encoding="utf-8") as f:
                json.dump(job, f, indent=2)

    # ---- the way out -----------------------------------------------------------------------

    def cleanup(self) -> None:
        """Stops everything this run started, in order; each step bounded, none skipped because
        an earlier one failed."""
        steps = []
        if self.submit is not None and self.submit.poll() is None:
            steps.append(("stop following the job", lambda: processes.stop(self.submit, 5)))
        if self.job_id and not self.job_ended and self.endpoint:
            steps.append((f"cancel job {self.job_id}", self._cancel))
        if self.key_root:
            # Early: `ray job stop` SIGKILLs us 3 s after its SIGTERM (RAY_JOB_STOP_WAIT_TIME_S);
            # the daemons hold copies of their own.
            steps.append(("remove the keys", lambda: shutil.rmtree(self.key_root)))
        if self.agents:
            steps.append(("stop the agents", lambda: self._stop_actors(self.agents)))
        if self.holders:
            steps.append(("release the GPU holders", lambda: self._kill(self.holders)))
        if self.coordinator is not None:
            steps.append(("stop the coordinator", lambda: self._stop_actors([self.coordinator])))
        if self.pg is not None:
            steps.append(("remove the placement group",
                          lambda: ray.util.remove_placement_group(self.pg)))
        for what, step in steps:
            try:
                step()
            except Exception as e:  # noqa: BLE001 - go on with the rest, saying what failed
                say(f"warning: could not {what}: {e}")

    def _cancel(self) -> None:
        subprocess.run([self.binary, "cancel", self.job_id, "--coordinator", self.endpoint,
                        "--keys", os.path.join(self.key_root or "", "keys")],
                       capture_output=True, timeout=15, cwd=self.work_dir)
        say(f"cancelled job {self.job_id}")

    def _stop_actors(self, actors: list) -> None:
        # Each stops its daemon (SIGTERM, then SIGKILL after 10 s) and is then killed for good.
        refs = [a.stop.remote() for a in actors]
        ray.wait(refs, num_returns=len(refs), timeout=20)
        self._kill(actors)

    @staticmethod
    def _kill(actors: list) -> None:
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    try:
        shape = read_job_shape(args.spec, args.devices)
        binary = resolve_binary(args.shardline_binary)
    except (SpecError, LaunchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    launch = Launch(args, shape, binary)
    try:
        launch.connect()
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    # After ray.init, whose own SIGTERM handler (a stack dump) would take the place of ours.
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        launch.reserve(launch.device_count())
        keys = launch.make_keys()
        launch.start_daemons(keys)
        return launch.follow()
    except KeyboardInterrupt:
        say("interrupted: cancelling the job and stopping the daemons")
        return 130
    except (LaunchError, placement.PlacementTimeout) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        # A second Ctrl-C or SIGTERM must not cut the cleanup short (the actors would still end
        # with this driver, but the keys would stay).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        launch.cleanup()
