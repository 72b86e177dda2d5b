"""The placement group: one bundle per device, reserved before anything starts, and what the
launcher says while Ray cannot yet give it."""

from __future__ import annotations

import time
from typing import Callable

import ray
from ray.util.placement_group import (PlacementGroup, placement_group, placement_group_table,
                                      remove_placement_group)

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


class PlacementTimeout(RuntimeError):
    """Ray could not give the placement group before the deadline; the message says why."""


def device_bundles(device_kind: str, count: int, cpus_per_device: int) -> list[dict[str, float]]:
    """One bundle per device: {"CPU": k} for a CPU device (its k cores are its actor's threads),
    {"GPU": 1, "CPU": k} for a GPU (k cores for its actor's host side)."""
    bundle: dict[str, float] = {"CPU": float(cpus_per_device)}
    if device_kind == "cuda":
        bundle = {"GPU": 1.0, "CPU": float(cpus_per_device)}
    return [dict(bundle) for _ in range(count)]


def _amount(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def describe_shortfall(bundles: list[dict[str, float]], strategy: str) -> str:
    """"waiting for 4 bundles of {CPU: 1} (PACK), 4 CPU in all: the Ray cluster has 2 CPU (2 free)
    on 1 node"."""
    shape = ", ".join(f"{k}: {_amount(v)}" for k, v in bundles[0].items())
    need = ", ".join(f"{_amount(v * len(bundles))} {k}" for k, v in bundles[0].items())
    total = ray.cluster_resources()
    free = ray.available_resources()
    have = ", ".join(f"{_amount(total.get(k, 0))} {k} ({_amount(free.get(k, 0))} free)"
                     for k in bundles[0])
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    line = (f"waiting for {len(bundles)} bundles of {{{shape}}} ({strategy}), {need} in all: "
            f"the Ray cluster has {have} on {nodes} node{'s' if nodes != 1 else ''}")
    if strategy == "STRICT_SPREAD" and nodes < len(bundles):
        line += f" (STRICT_SPREAD needs {len(bundles)} nodes)"
    return line


def reserve(bundles: list[dict[str, float]], strategy: str, name: str, timeout_s: float,
            say: Callable[[str], None]) -> PlacementGroup:
    """Reserves the bundles, saying what it waits for whenever that changes (and every 30 s),
    and gives up at the deadline with that message (the group is removed)."""
    pg = placement_group(bundles, strategy=strategy, name=name)
    deadline = time.monotonic() + timeout_s
    last, last_said = "", 0.0
    while True:
        left = deadline - time.monotonic()
        ready, _ = ray.wait([pg.ready()], timeout=max(0.0, min(2.0, left)))
        if ready:
            return pg
        message = describe_shortfall(bundles, strategy)
        if time.monotonic() >= deadline:
            remove_placement_group(pg)
            raise PlacementTimeout(f"{message}; gave up after {timeout_s:g} s "
                                   "(--placement-timeout-s)")
        if message != last or time.monotonic() - last_said >= 30:
            say(f"{message} (up to {max(0, int(left))} s more)")
            last, last_said = message, time.monotonic()


def bundles_by_node(pg: PlacementGroup) -> dict[str, list[int]]:
    """Ray node id -> the bundle indices Ray placed there, in node order of their first bundle."""
    nodes: dict[str, list[int]] = {}
    for index, node in sorted(placement_group_table(pg)["bundles_to_node_id"].items()):
        nodes.setdefault(node, []).append(int(index))
    return nodes
