"""What the launcher needs of a job spec: how many devices of which kind, and where it writes.

The spec is validated by `shardline submit` itself (the one parser, placement/job_spec.cc); this
reads only the few keys that size the placement group, with the defaults examples/*.yaml document,
and says which key to fix or which flag to give when it cannot tell.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import yaml


class SpecError(ValueError):
    """The spec cannot size a placement group (unreadable, or a count that is not given)."""


@dataclasses.dataclass(frozen=True)
class JobShape:
    name: str
    kind: str  # train, serve or comm-check
    device_kind: str  # cpu or cuda
    max_devices: int  # the most devices the job uses (its world, or elastic max_actors)
    min_devices: int  # the fewest it runs on (elastic min_actors; else max_devices)
    checkpoint_dir: str  # as written in the spec ("" when none)

    @property
    def elastic(self) -> bool:
        return self.min_devices < self.max_devices


def _positive_int(value: Any, where: str, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{path}: {where} must be a positive integer, not {value!r}")
    return value


def read_job_shape(path: str, devices_flag: int = 0) -> JobShape:
    """The shape of the job in the YAML file at `path`. `devices_flag` (the launcher's --devices;
    0: not given) stands for a count the spec leaves to the cluster (`parallel: auto` without
    `actors` or elastic max_actors)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise SpecError(f"cannot read job spec {path}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: not YAML: {e}") from e
    if not isinstance(doc, dict):
        raise SpecError(f"{path}: a job spec is a YAML mapping")
    name = str(doc.get("name", ""))
    kind = str(doc.get("kind", ""))
    if not name or kind not in ("train", "serve", "comm-check"):
        raise SpecError(f"{path}: not a job spec (it needs a name and a kind: train, serve or "
                        f"comm-check; got {kind!r})")
    device_kind = str(doc.get("devices", "cpu"))
    if device_kind not in ("cpu", "cuda"):
        raise SpecError(f"{path}: devices must be cpu or cuda, not {device_kind!r}")

    actors = doc.get("actors")
    if actors is not None:
        actors = _positive_int(actors, "actors", path)
    parallel = doc.get("parallel")
    auto = parallel == "auto"
    world = None
    if isinstance(parallel, dict):
        world = 1
        for key in ("tp", "pp", "dp"):
            world *= _positive_int(parallel.get(key, 1), f"parallel.{key}", path)
    elif parallel is None and kind in ("train", "serve"):
        world = 1  # the one-rank default layout
    elastic = doc.get("elastic")
    elastic = elastic if isinstance(elastic, dict) else ({} if elastic is not None else None)

    # The most devices: elastic max_actors, else actors, else the layout's world; a count the
    # spec leaves open (`parallel: auto` on any number) comes from --devices.
    most = None
    if elastic is not None and elastic.get("max_actors") is not None:
        most = _positive_int(elastic["max_actors"], "elastic.max_actors", path)
    elif actors is not None:
        most = actors
    elif world is not None and not auto:
        most = world
    if devices_flag:
        most = devices_flag if most is None else min(most, devices_flag)
    if most is None:
        raise SpecError(
            f"{path}: the spec does not say how many devices the job uses "
            "(`parallel: auto` without `actors` or elastic max_actors): give --devices N")

    fewest = most
    if elastic is not None and kind == "train":
        if elastic.get("min_actors") is not None:
            fewest = _positive_int(elastic["min_actors"], "elastic.min_actors", path)
        elif auto:
            fewest = 1
        elif isinstance(parallel, dict):
            fewest = parallel.get("tp", 1) * parallel.get("pp", 1)
        else:
            fewest = 1
        fewest = min(fewest, most)

    checkpoint = doc.get("checkpoint")
    checkpoint_dir = str(checkpoint.get("dir", "")) if isinstance(checkpoint, dict) else ""
    return JobShape(name=name, kind=kind, device_kind=device_kind, max_devices=most,
                    min_devices=fewest, checkpoint_dir=checkpoint_dir)


def resolve_checkpoint_dir(shape: JobShape, work_dir: str) -> str:
    """Where the job's checkpoints land: a relative dir resolves against the directory
    `shardline submit` runs in (the launcher's --work-dir), as for `shardline submit` itself."""
    if not shape.checkpoint_dir:
        return ""
    return os.path.normpath(os.path.join(work_dir, shape.checkpoint_dir))
