#!/usr/bin/env python3
"""Shardline's checkpoint saves against PyTorch 2's distributed checkpoint, in one run.

Runs the peer (bench/checkpoint_dcp_peer.py: torch.distributed.checkpoint save and async_save of
the same bytes and tensors on 2 ranks), then bench/checkpoint_bench (GPT-2 small on 2 tensor-
parallel ranks, training with asynchronous saves, then synchronous ones, then the writer alone
against dd), then the peer again (the disk drifts: its medians are over both runs), and prints
the ratios with the peer's version beside them:

  - the loop's stall per save, asynchronous: Shardline's (copy into the staging buffer) against
    the time dcp.async_save takes to return;
  - a synchronous save: Shardline's writer alone (both ranks' files, fsync and rename) against
    dcp.save of the same bytes (FileSystemWriter's defaults, which fsync);

  bench/checkpoint_compare.py BUILD_DIR [--python /opt/shardline-bench/torch2/bin/python]
      [--dir /tmp] [checkpoint_bench flags...]

After bench/setup-torch2.sh. Not part of ctest.
"""

import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def result_of(output, what):
    for line in output.splitlines():
        if line.startswith("result "):
            fields = dict(item.split("=", 1) for item in line.split()[1:])
            return fields
    sys.exit(f"{what} printed no result line:\n{output}")


def run(command, what):
    print(f"== {what}: {' '.join(command)}", flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        sys.exit(f"{what} failed with {done.returncode}")
    return result_of(done.stdout, what)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build_dir")
    parser.add_argument("--python", default="/opt/shardline-bench/torch2/bin/python")
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--rounds", type=int, default=3, help="peer rounds per run")
    args, bench_flags = parser.parse_known_args()
    peer = [args.python, os.path.join(HERE, "checkpoint_dcp_peer.py"), "--dir", args.dir,
            "--rounds", str(args.rounds)]
    ours = [os.path.join(args.build_dir, "bench", "checkpoint_bench"), "--dir", args.dir,
            *bench_flags]
    before = run(peer, "peer")
    shardline = run(ours, "Shardline")
    after = run(peer, "peer")
    torch = before["torch"]
    if float(before["bytes"]) != float(shardline["bytes"]):
        print(f"note: the peer saves {before['bytes']} bytes, Shardline {shardline['bytes']}")

    def median(key):
        return statistics.median([float(before[key]), float(after[key])])

    peer_stall, peer_save = median("async_stall_s"), median("save_s")
    ours_stall = float(shardline["async_stall_s"])
    ours_save = float(shardline["bytes"]) / (float(shardline["writer_gbps"]) * 1e9)
    step = float(shardline["step_s"])
    print(f"\nShardline against torch {torch} (torch.distributed.checkpoint), same bytes, "
          f"2 ranks")
    print(f"  async stall per save: Shardline {ours_stall:.3f} s ({100 * ours_stall / step:.1f}% "
          f"of a {step:.2f} s step), dcp.async_save {peer_stall:.3f} s "
          f"({100 * peer_stall / step:.1f}%): {peer_stall / ours_stall:.1f}x less stall")
    print(f"  synchronous save: Shardline's writer {ours_save:.3f} s, dcp.save {peer_save:.3f} s: "
          f"Shardline at {100 * peer_save / ours_save:.0f}% of the peer's speed "
          f"(each the median of its rounds; dd alongside: {float(shardline['dd_gbps']):.2f} GB/s)")


if __name__ == "__main__":
    main()
