"""Shardline on a Ray cluster: a thin launcher that starts Shardline's own daemons inside Ray.

`ray job submit -- python -m shardline_ray SPEC.yaml` reserves a placement group with a bundle per
device, starts the coordinator on the head node and one agent per node inside Ray actors pinned to
the bundles, submits the job and streams its progress. No model code lives here: the coordinator,
agents and actors are the `shardline` binary's (python/README.md).
"""

__version__ = "0.1.0"
