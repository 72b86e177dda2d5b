"""Which Python runs the PyTorch peer of a benchmark: the PyTorch 2 venv of bench/setup-torch2.sh
when it imports torch, else Debian's python3-torch. Every compare script prints what it chose."""
import os
import subprocess
import sys

VENV_PYTHON = "/opt/shardline-bench/torch2/bin/python"
DEBIAN_PYTHON = "/usr/bin/python3"


def torch_version(python, need_gloo=False):
    """torch.__version__ of `python`, or None when it cannot import torch (or Gloo, if asked)."""
    probe = "import torch, torch.distributed as d; print(torch.__version__, " \
            "d.is_available() and d.is_gloo_available())"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=180)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    version, gloo = done.stdout.split()
    return version if gloo == "True" or not need_gloo else None


def pick_python(requested, script, need_gloo=False):
    """(python, torch version, where it comes from); exits with a message when none has torch."""
    what = "torch with Gloo" if need_gloo else "torch"
    if requested:
        version = torch_version(requested, need_gloo)
        if version is None:
            sys.exit(f"{script}: {requested} has no {what}")
        return requested, version, "given on the command line"
    if os.access(VENV_PYTHON, os.X_OK):
        version = torch_version(VENV_PYTHON, need_gloo)
        if version is not None:
            return VENV_PYTHON, version, "PyPI, bench/setup-torch2.sh's venv"
        print(f"{script}: {VENV_PYTHON} does not import {what}; falling back to Debian's",
              flush=True)
    version = torch_version(DEBIAN_PYTHON, need_gloo)
    if version is None:
        sys.exit(f"{script}: no {what}: run bench/setup-torch2.sh, or apt install python3-torch")
    return DEBIAN_PYTHON, version, "Debian's python3-torch (run bench/setup-torch2.sh for torch 2)"
