"""The Ray actors that run Shardline's daemons: the coordinator on the head node, one agent per
node in the placement group's bundles, and (for GPUs) a holder in every other bundle of a node,
which tells the agent which GPU Ray gave that bundle.

Each actor owns one daemon process, started with PR_SET_PDEATHSIG so that it dies with the actor's
worker process (and the agent's actors with the agent): a node that Ray loses leaves no Shardline
process behind. A daemon that exits by itself takes its actor with it, so that Ray restarts the
actor (max_restarts) and with it the daemon. The classes are plain; the launcher makes them Ray
actors with the options (resources, bundle, restarts) each needs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import warnings
from typing import Mapping, Optional, Sequence

import ray
from ray.util.placement_group import PlacementGroup, placement_group_table

from shardline_ray import processes

# What each daemon needs of the run's key directory (`shardline keygen`): the coordinator its
# pair and the allowlist; an agent the coordinator's public key and the node pair (which it hands
# on to its actors).
COORDINATOR_KEYS = ("coordinator.key", "coordinator.key_secret", "allowlist")
AGENT_KEYS = ("coordinator.key", "node.key", "node.key_secret")


def ray_logs_dir(run_id: str) -> str:
    """This node's folder for the run's daemon logs: inside Ray's own log folder of the session
    (`ray logs` lists it), else the temp dir."""
    try:
        base = ray._private.worker._global_node.get_logs_dir_path()  # no public API for it
    except AttributeError:
        base = os.environ.get("TMPDIR", "/tmp")
    path = os.path.join(base, "shardline", run_id)
    os.makedirs(path, exist_ok=True)
    return path


class _Daemon:
    """One daemon process, its private dir (keys, state) and the watcher that ends the actor
    when the daemon ends by itself."""

    def __init__(self, what: str, dir_prefix: str, keys: Mapping[str, bytes]):
        self.what = what
        self.dir = processes.private_dir(dir_prefix)
        self.keys_dir = processes.write_keys(self.dir, keys)
        self.process: Optional[subprocess.Popen] = None
        self.log_path = ""
        self._stopping = False

    def start(self, argv: Sequence[str], log_path: str,
              env: Optional[Mapping[str, str]] = None) -> None:
        self.log_path = log_path
        self.process = processes.spawn(argv, log_path, env=env)
        threading.Thread(target=self._watch, name=f"{self.what}-watch", daemon=True).start()

    def _watch(self) -> None:
        assert self.process is not None
        status = self.process.wait()
        if self._stopping:
            return
        print(f"{self.what} exited (status {status}); ending this actor so that Ray restarts "
              f"it if it may. Log {self.log_path}:\n{processes.tail(self.log_path)}",
              file=sys.stderr, flush=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        os._exit(1)  # an unexpected death, which Ray's max_restarts answers

    def stop(self) -> Optional[int]:
        self._stopping = True
        status = processes.stop(self.process) if self.process is not None else None
        shutil.rmtree(self.dir, ignore_errors=True)
        return status


class CoordinatorDaemon:
    """`shardline coordinator` on this node, listening on the node's Ray address."""

    def __init__(self, binary: str, keys: Mapping[str, bytes], run_id: str, log_level: str,
                 heartbeat_timeout_ms: int):
        self.daemon = _Daemon("shardline coordinator", "shardline-ray-coordinator-", keys)
        ip = ray.util.get_node_ip_address()
        endpoint_file = os.path.join(self.daemon.dir, "endpoint")
        log = os.path.join(ray_logs_dir(run_id), "coordinator.log")
        self.daemon.start(
            [binary, "coordinator", "--listen", f"tcp://{ip}:0", "--endpoint-file", endpoint_file,
             "--state-dir", os.path.join(self.daemon.dir, "state"), "--keys",
             self.daemon.keys_dir, "--heartbeat-timeout-ms", str(heartbeat_timeout_ms),
             "--log-level", log_level], log)
        assert self.daemon.process is not None
        self._endpoint = processes.wait_for_file(endpoint_file, self.daemon.process, 30,
                                                 "the coordinator", log)

    def info(self) -> dict:
        return {"endpoint": self._endpoint, "pid": self.daemon.process.pid,
                "log": self.daemon.log_path, "node_id": ray.get_runtime_context().get_node_id()}

    def stop(self) -> Optional[int]:
        return self.daemon.stop()


def holder_name(run_id: str, bundle: int) -> str:
    """The DeviceHolder of a bundle is found by name: an actor handle among an agent's
    constructor arguments would keep them in the object store, which a restart depends on."""
    return f"shardline-holder-{run_id}-{bundle}"


class DeviceHolder:
    """Holds one GPU bundle of a node whose agent sits in another: says which GPU Ray gave it."""

    def where(self) -> tuple[str, list[str]]:
        return (ray.get_runtime_context().get_node_id(),
                [str(g) for g in ray.get_runtime_context().get_accelerator_ids()["GPU"]])


class AgentDaemon:
    """`shardline agent` for the bundles this actor owns on its node.

    The actor sits in its anchor bundle; the others it owns on the same node are reserved by the
    placement group (and, for GPUs, held by DeviceHolder actors). Its devices are those bundles:
    `cpu:N`, or `cuda` with CUDA_VISIBLE_DEVICES set to the GPUs Ray gave them. Restarted by Ray
    after its node was lost, it counts again the owned bundles that Ray placed beside it."""

    def __init__(self, binary: str, endpoint: str, keys: Mapping[str, bytes], pg: PlacementGroup,
                 anchor: int, owned: Sequence[int], device_kind: str, cpus_per_device: int,
                 run_id: str, log_level: str, connect_timeout_s: float):
        context = ray.get_runtime_context()
        ray_node = context.get_node_id()
        placed = placement_group_table(pg)["bundles_to_node_id"]
        here = sorted(b for b in owned if b == anchor or placed.get(b) == ray_node)
        # Several agents may share a Ray node (Ray re-placed bundles of a lost node beside
        # another's): the anchor bundle keeps their node ids apart.
        self.node_id = f"ray-{ray_node[:8]}-{anchor}"
        # Each actor's threads: its bundle's CPUs (the agent would otherwise split the node's).
        threads = str(cpus_per_device)
        env = {"OMP_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads}
        if device_kind == "cuda":
            gpus = [str(g) for g in context.get_accelerator_ids()["GPU"]]
            for bundle in here:
                if bundle != anchor:
                    holder = ray.get_actor(holder_name(run_id, bundle))
                    node, ids = ray.get(holder.where.remote(), timeout=120)
                    if node == ray_node:
                        gpus += ids
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
            devices = "cuda"
            self.devices = f"cuda x{len(gpus)} (CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']})"
        else:
            devices = f"cpu:{len(here)}"
            self.devices = devices
        with warnings.catch_warnings():
            # Ray 2.60's property reads its own deprecated actor_id inside.
            warnings.simplefilter("ignore", DeprecationWarning)
            self.restarted = bool(context.was_current_actor_reconstructed)
        self.daemon = _Daemon(f"shardline agent {self.node_id}", "shardline-ray-agent-", keys)
        logs = ray_logs_dir(run_id)
        # No --advertise-address: the agent takes the address of the interface that routes to
        # the coordinator, the rule every launcher follows (protocol/address_rule.h). Ray's node
        # IP may be another interface's, which is how vLLM's placement groups came to wait
        # forever (vllm#7815).
        self.daemon.start(
            [binary, "agent", "--coordinator", endpoint, "--devices", devices, "--node-id",
             self.node_id, "--keys", self.daemon.keys_dir,
             "--log-dir", os.path.join(logs, f"actors-{self.node_id}"), "--connect-timeout-s", str(connect_timeout_s), "--log-level", log_level],
            os.path.join(logs, f"agent-{self.node_id}.log"), env=env)
        if self.restarted:
            print(f"Ray restarted this actor: agent {self.node_id} with {self.devices}",
                  flush=True)

    def info(self) -> dict:
        return {"node_id": self.node_id, "devices": self.devices, "pid": self.daemon.process.pid,
                "ip": ray.util.get_node_ip_address(), "log": self.daemon.log_path,
                "restarted": self.restarted}

    def stop(self) -> Optional[int]:
        return self.daemon.stop()
