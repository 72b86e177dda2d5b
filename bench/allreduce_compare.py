#!/usr/bin/python3
"""Runs the all-reduce benchmarks (Shardline's GlooCommunicator, raw Gloo, OpenMPI) in one go and
prints one table of bus bandwidth (2(n-1)/n * bytes / time) and ratios.

Builds nothing: give it a build directory where `ninja allreduce_gloo allreduce_mpi` ran.

  bench/allreduce_compare.py build-comm            # 4 KiB..256 MiB, 2 and 4 ranks, + MPI ring
  bench/allreduce_compare.py build-comm --quick    # up to 16 MiB, 2 ranks (about a minute)

Ranks are processes on this host talking over loopback. Shardline and raw Gloo run interleaved in
the same processes (allreduce_gloo --impl both); MPI runs under mpirun, by default with its own
algorithm choice and shared-memory transport, and, unless --quick, once more with the ring
algorithm forced (coll_tuned_allreduce_algorithm 4), the algorithm Gloo uses.
"""
import argparse
import math
import os
import re
import shutil
import subprocess
import sys

RESULT = re.compile(r"^RESULT impl=(\S+) n=(\d+) bytes=(\d+) iters=(\d+) "
                    r"seconds_per_op=(\S+) busbw_gbps=(\S+)$")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
RING = ["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm",
        "4"]


def run(command, timeout):
    print("+ " + " ".join(command), file=sys.stderr, flush=True)
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        sys.exit(f"timed out after {timeout} s: {' '.join(command)}")
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        sys.exit(f"failed with exit code {done.returncode}: {' '.join(command)}")
    results = {}
    for line in done.stdout.splitlines():
        match = RESULT.match(line.strip())
        if match:
            impl, n, size = match.group(1), int(match.group(2)), int(match.group(3))
            results[(impl, n, size)] = float(match.group(6))
    if not results:
        sys.exit(f"no RESULT lines from: {' '.join(command)}\n{done.stdout}{done.stderr}")
    return results


def human(size):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size // scale} {unit}"
    return f"{size} B"


def ratio(a, b):
    return f"{a / b:.2f}" if a and b else "-"


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build_dir", help="the CMake build directory holding bench/")
    parser.add_argument("--quick", action="store_true",
                        help="sizes up to 16 MiB, 2 ranks only, no forced-ring MPI run")
    parser.add_argument("--ranks", default=None, help="comma-separated world sizes (default 2,4)")
    parser.add_argument("--max-bytes", type=int, default=None)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per benchmark run")
    args = parser.parse_args()

    bench_dir = os.path.join(args.build_dir, "bench")
    gloo_bin = os.path.join(bench_dir, "allreduce_gloo")
    mpi_bin = os.path.join(bench_dir, "allreduce_mpi")
    if not os.access(gloo_bin, os.X_OK):
        sys.exit(f"{gloo_bin} not found: build it first (ninja -C {args.build_dir} "
                 "allreduce_gloo allreduce_mpi)")
    have_mpi = os.access(mpi_bin, os.X_OK) and shutil.which("mpirun") is not None
    if not have_mpi:
        print(f"note: {mpi_bin} or mpirun missing; MPI columns left empty", file=sys.stderr)

    max_bytes = args.max_bytes or ((16 << 20) if args.quick else (256 << 20))
    ranks = [int(r) for r in args.ranks.split(",")] if args.ranks else (
        [2] if args.quick else [2, 4])
    sizes_flag = ["--min-bytes", str(4 << 10), "--max-bytes", str(max_bytes)]

    results = {}
    for n in ranks:
        results.update(run([gloo_bin, "--ranks", str(n), "--impl", "both"] + sizes_flag,
                           args.timeout))
        if have_mpi:
            results.update(run(MPIRUN + ["-np", str(n), mpi_bin] + sizes_flag, args.timeout))
            if not args.quick:
                results.update(run(MPIRUN + RING + ["-np", str(n), mpi_bin, "--label",
                                                     "mpi_ring"] + sizes_flag, args.timeout))

    with_ring = any(key[0] == "mpi_ring" for key in results)
    header = ["size", "n", "Shardline GB/s", "raw Gloo GB/s", "MPI GB/s"]
    if with_ring:
        header.append("MPI ring GB/s")
    header += ["Shardline/Gloo", "Shardline/MPI"]
    rows = []
    worst = None
    log_ratios = []
    for n in ranks:
        for size in sorted({key[2] for key in results if key[1] == n}):
            shardline = results.get(("shardline", n, size))
            gloo = results.get(("gloo", n, size))
            mpi = results.get(("mpi", n, size))
            row = [human(size), str(n), f"{shardline:.3f}" if shardline else "-",
                   f"{gloo:.3f}" if gloo else "-", f"{mpi:.3f}" if mpi else "-"]
            if with_ring:
                ring = results.get(("mpi_ring", n, size))
                row.append(f"{ring:.3f}" if ring else "-")
            row += [ratio(shardline, gloo), ratio(shardline, mpi)]
            rows.append(row)
            if size >= (1 << 20) and shardline and gloo:
                worst = min(worst, shardline / gloo) if worst is not None else shardline / gloo
                log_ratios.append(math.log(shardline / gloo))

    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    print(" | ".join(h.rjust(w) for h, w in zip(header, widths)))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(c.rjust(w) for c, w in zip(row, widths)))
    if worst is not None:
        # On a shared machine single points swing both ways; the geometric mean over the points
        # is the steadier estimate of a systematic overhead.
        geomean = math.exp(sum(log_ratios) / len(log_ratios))
        print(f"\nShardline/Gloo from 1 MiB up: lowest {worst:.2f}, geometric mean {geomean:.2f} "
              f"(target >= 0.95: lowest point {'meets' if worst >= 0.95 else 'misses'} it, "
              f"mean {'meets' if geomean >= 0.95 else 'misses'} it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
