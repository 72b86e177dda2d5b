#!/usr/bin/python3
"""Does the cluster health check tell the truth? Times the 2-rank shared-memory all-reduce two
ways, alternating round by round on this machine: the comm-check job a user runs after a launch
(`shardline up --job` of a comm-check spec: two actors of a local cluster, all_reduce_sum,
warm-ups then timed runs from a barrier, the slowest rank's average), and the benchmark's shm row
(allreduce_mpi --impl shm under mpirun, as bench/allreduce_compare.py runs it: the same
communicator in two bare processes, untimed runs for the tuner, then ~0.5 s of timed runs per
size). The table gives each one's median time per operation over the rounds and their ratio; the
target (issue 34) is comm-check within 25% of the benchmark from 4 KiB up.

Alternating matters: on a VM whose vCPUs the hypervisor moves, one minute can be 2-5x slower than
the next for both alike (allreduce_compare.py says more).

  bench/comm_check_compare.py build [--rounds 5] [--max-bytes 1048576]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

from tables import print_table  # bench/tables.py

BENCH = re.compile(r"^RESULT impl=shm n=2 bytes=(\d+) iters=\d+ seconds_per_op=(\S+) ")
# comm-check's table: "all_reduce_sum  1 MiB    2      126.4      4.468 ..."
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
CHECK = re.compile(r"^all_reduce_sum\s+(\d+) (B|KiB|MiB|GiB)\s+2\s+([0-9.]+)\s")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]


def run(command, timeout, cwd=None):
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, cwd=cwd)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stdout[-3000:]}")
    return done.stdout


def bench_round(mpi_bin, max_bytes):
    with tempfile.TemporaryDirectory(prefix="comm_check_compare_") as store:
        out = run(MPIRUN + ["-np", "2", mpi_bin, "--impl", "shm", "--store", store,
                            "--min-bytes", "4", "--max-bytes", str(max_bytes)], 900)
    return {int(m.group(1)): float(m.group(2)) * 1e6
            for m in map(BENCH.match, out.splitlines()) if m}


def comm_check_round(shardline, max_bytes, counts):
    with tempfile.TemporaryDirectory(prefix="comm_check_compare_") as work:
        spec = os.path.join(work, "check.yaml")
        with open(spec, "w") as f:
            f.write("name: comm-check-compare\nkind: comm-check\nactors: 2\ndevices: cpu\n"
                    f"comm_check:\n  max_bytes: {max_bytes}\n  uneven_sizes: false\n"
                    "  ops: [all_reduce_sum]\n" + counts)
        out = run([shardline, "up", "--job", spec, "--insecure", "--devices", "2",
                   "--work-dir", os.path.join(work, "up")], 900, cwd=work)
    return {int(m.group(1)) * UNITS[m.group(2)]: float(m.group(3))
            for m in map(CHECK.match, out.splitlines()) if m}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build_dir")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-bytes", type=int, default=1 << 20)
    parser.add_argument("--warmup-iterations", type=int, default=None,
                        help="comm-check's warmup_iterations (default: the spec's default)")
    parser.add_argument("--shardline", default=None,
                        help="the shardline binary whose comm-check to time (default: the build's;"
                             " another, e.g. an older build's, to compare before and after)")
    parser.add_argument("--iterations", type=int, default=None,
                        help="comm-check's iterations (default: the spec's default)")
    args = parser.parse_args()
    build_dir = os.path.abspath(args.build_dir)  # comm-check runs in a folder of its own
    mpi_bin = os.path.join(build_dir, "bench", "allreduce_mpi")
    shardline = os.path.abspath(args.shardline or os.path.join(build_dir, "cli", "shardline"))
    for path, target in ((mpi_bin, "allreduce_mpi"), (shardline, "shardline")):
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} not found: ninja -C {build_dir} {target}")
    version = run(["mpirun", "--version"], 60).splitlines()[0]
    print(f"benchmark row: allreduce_mpi --impl shm (this build) under {version}; comm-check of "
          f"{shardline}")
    print(f"cpu: {open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}, "
          f"{os.cpu_count()} cpus; {args.rounds} alternating rounds, medians")
    counts = "".join(f"  {key}: {value}\n" for key, value in
                     (("warmup_iterations", args.warmup_iterations),
                      ("iterations", args.iterations)) if value is not None)
    print("comm-check: " + (counts.strip().replace("\n", ", ") or "its default counts"))
    bench, check = {}, {}
    for r in range(args.rounds):
        for size, us in bench_round(mpi_bin, args.max_bytes).items():
            bench.setdefault(size, []).append(us)
        for size, us in comm_check_round(shardline, args.max_bytes, counts).items():
            check.setdefault(size, []).append(us)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    rows, worst = [], 0.0
    for size in sorted(set(bench) & set(check)):
        b, c = statistics.median(bench[size]), statistics.median(check[size])
        ratio = c / b
        if size >= 4096:
            worst = max(worst, abs(ratio - 1))
        rows.append([f"{size} B" if size < 1024 else f"{size >> 10} KiB" if size < 1 << 20
                     else f"{size >> 20} MiB", f"{b:.1f}", f"{c:.1f}", f"{ratio:.2f}"])
    print_table(["size", "benchmark shm us", "comm-check us", "comm-check/benchmark"], rows)
    verdict = "met" if worst <= 0.25 else "missed"
    print(f"\ncomm-check within 25% of the benchmark from 4 KiB: {verdict} "
          f"(largest difference {worst * 100:.0f}%)")


if __name__ == "__main__":
    main()
