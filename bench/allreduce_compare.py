#!/usr/bin/python3
"""Runs the all-reduce benchmarks (Shardline's shared-memory and Gloo communicators, raw Gloo,
a memcpy of the same bytes, OpenMPI) in one go and prints one table of bus bandwidth
(2(n-1)/n * bytes / time) and ratios.

Builds nothing: give it a build directory where `ninja allreduce_gloo allreduce_mpi` ran.

  bench/allreduce_compare.py build-dev            # 4 B..256 MiB, 2 and 4 ranks, + MPI ring
  bench/allreduce_compare.py build-dev --quick    # up to 16 MiB, 2 ranks (about a minute)

Ranks are processes on this host. Shardline's shm runs inside the MPI processes, alternating with
MPI_Allreduce operation by operation (allreduce_mpi --impl mpi,shm,shm-shared), so that each ratio
is paired:
on a VM whose vCPUs the hypervisor moves, one run can be 2-5x slower than the next for every
implementation alike, and two separate runs compare the host's moods rather than the code. MPI
runs with its own algorithm choice and shared-memory transport (vader, CMA single copy) and,
unless --quick, once more with the ring algorithm forced (coll_tuned_allreduce_algorithm 4);
each is repeated --rounds times and the table gives medians, the ratio column the median of the
paired ratios against MPI's better run and their range. Every implementation first runs
untimed operations at each size, as many as Shardline's tuner needs to try each of its
algorithms there (allreduce_bench_common.h). Shardline's Gloo path, raw Gloo and
memcpy run interleaved in the same forked processes (allreduce_gloo), once.

Two Shardline rows: `shm` all-reduces a plain heap buffer, as MPI does; `shm-shared` one from
comm::SharedHostAllocator, which the peers map (NCCL's ncclMemAlloc; the trainer's data-parallel
gradients live there), so that its single copy reads them with no system call. Targets (issue 13):
>= 1.25x OpenMPI's better run at every size from 4 KiB, at 2 and 4 ranks, and a 4 KiB all-reduce
within 10 us at 2 ranks; the verdict is printed for each row.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from tables import print_table  # bench/tables.py: this script's folder is on sys.path

RESULT = re.compile(r"^RESULT impl=(\S+) n=(\d+) bytes=(\d+) iters=(\d+) "
                    r"seconds_per_op=(\S+) busbw_gbps=(\S+)$")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
SHM_ROWS = ("shm", "shm-shared")
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
            results[("seconds:" + impl, n, size)] = float(match.group(5))
    if not results:
        sys.exit(f"no RESULT lines from: {' '.join(command)}\n{done.stdout}{done.stderr}")
    return results


def paired_mpi_run(command, timeout, label):
    """One mpirun of allreduce_mpi with Shardline's shm rows beside MPI; their keys get `label`'s
    suffix so that the shm of the ring run stays apart from that of the default run."""
    with tempfile.TemporaryDirectory(prefix="allreduce_compare_") as store:
        got = run(command + ["--impl", "mpi," + ",".join(SHM_ROWS), "--store", store], timeout)
    return {(k[0] + (label if k[0].split(":")[-1] in SHM_ROWS else ""), k[1], k[2]): v
            for k, v in got.items()}


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
    parser.add_argument("--rounds", type=int, default=3,
                        help="paired shm + MPI runs per MPI algorithm (default 3)")
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
    sizes_flag = ["--min-bytes", "4", "--max-bytes", str(max_bytes)]

    once = {}     # (impl, n, size) -> GB/s or seconds, from the single Gloo run
    rounds = []   # per round: {(impl, n, size): value}, shm paired with each MPI run
    for n in ranks:
        # Shardline's Gloo path and raw Gloo interleaved: the difference is our overhead.
        once.update(run([gloo_bin, "--ranks", str(n), "--impl", "shardline,gloo,memcpy"] +
                        sizes_flag, args.timeout))
    for r in range(args.rounds):
        got = {}
        for n in ranks:
            if have_mpi:
                got.update(paired_mpi_run(MPIRUN + ["-np", str(n), mpi_bin] + sizes_flag,
                                          args.timeout, ""))
                if not args.quick:
                    got.update(paired_mpi_run(MPIRUN + RING + ["-np", str(n), mpi_bin, "--label",
                                                                "mpi_ring"] + sizes_flag,
                                              args.timeout, "@ring"))
            else:
                got.update(run([gloo_bin, "--ranks", str(n), "--impl", "shm"] + sizes_flag,
                               args.timeout))
        rounds.append(got)

    if have_mpi:
        version = subprocess.run(["mpirun", "--version"], stdout=subprocess.PIPE, text=True)
        print("peer: " + version.stdout.splitlines()[0] if version.stdout else "peer: OpenMPI")
    print(f"{args.rounds} rounds; GB/s and us are medians over them; a ratio is shm against the MPI "
          "run it alternated with, the lower of the two MPI runs' in a round, median [range]")

    def median(key):
        values = [got[key] for got in rounds if key in got]
        if key[0].split(":")[-1] in SHM_ROWS:  # the ring run's shm samples count too
            values += [got[(key[0] + "@ring",) + key[1:]] for got in rounds
                       if (key[0] + "@ring",) + key[1:] in got]
        if not values and key in once:
            values = [once[key]]
        return statistics.median(values) if values else None

    def paired_ratios(shm, n, size):
        ratios = []
        for got in rounds:
            pairs = [(got.get((shm, n, size)), got.get(("mpi", n, size))),
                     (got.get((shm + "@ring", n, size)), got.get(("mpi_ring", n, size)))]
            pairs = [a / b for a, b in pairs if a and b]
            if pairs:
                ratios.append(min(pairs))
        return ratios

    keys = set(once) | {k for got in rounds for k in got}
    columns = [("shm", "shm"), ("shm-shared", "shm shared"), ("shardline", "Shardline gloo"),
               ("gloo", "raw Gloo"),
               ("mpi", "MPI"), ("mpi_ring", "MPI ring"), ("memcpy", "memcpy")]
    columns = [c for c in columns if any(key[0] == c[0] for key in keys)]
    shm_rows = [shm for shm in SHM_ROWS if any(key[0] == shm for key in keys)]
    header = ["size", "n"] + [f"{title} GB/s" for _, title in columns] + [
        "shm us", "MPI best us"] + [f"{shm}/MPI best" for shm in shm_rows] + [
        "shm/Shardline gloo"]
    rows = []
    misses = {shm: [] for shm in shm_rows}
    latency = None  # 4 KiB at 2 ranks
    for n in ranks:
        for size in sorted({key[2] for key in keys if key[1] == n}):
            row = [human(size), str(n)]
            for impl, _ in columns:
                value = median((impl, n, size))
                row.append(f"{value:.3f}" if value else "-")
            shm_s = median(("seconds:shm", n, size))
            mpi_s = [v for v in (median(("seconds:mpi", n, size)),
                                 median(("seconds:mpi_ring", n, size))) if v]
            best_s = min(mpi_s) if mpi_s else None
            row += [f"{shm_s * 1e6:.1f}" if shm_s else "-",
                    f"{best_s * 1e6:.1f}" if best_s else "-"]
            for shm in shm_rows:
                ratios = paired_ratios(shm, n, size)
                paired = statistics.median(ratios) if ratios else None
                row.append(f"{paired:.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"
                           if len(ratios) > 1 else f"{paired:.2f}" if paired else "-")
                if size >= (4 << 10) and paired and paired < 1.25:
                    met = sum(1 for x in ratios if x >= 1.25)
                    misses[shm].append(f"{human(size)} at {n} ranks ({paired:.2f}x; >= 1.25x in "
                                       f"{met} of {len(ratios)} rounds)")
            row.append(ratio(median(("shm", n, size)), median(("shardline", n, size))))
            rows.append(row)
            if size == (4 << 10) and n == 2 and shm_s:
                latency = shm_s

    print_table(header, rows, align="right")
    if have_mpi:
        for shm in shm_rows:
            print(f"\n{shm} >= 1.25x OpenMPI's better run from 4 KiB (median of paired rounds): " +
                  ("met at every size" if not misses[shm] else
                   "missed at " + ", ".join(misses[shm])))
    if latency is not None:
        print(f"4 KiB all-reduce at 2 ranks: {latency * 1e6:.1f} us (target <= 10 us: "
              f"{'met' if latency <= 10e-6 else 'missed'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
