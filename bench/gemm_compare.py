#!/usr/bin/env python3
"""CPU GEMM throughput of candidate BLAS libraries against PyTorch 2 (MKL), in the same run.

  bench/gemm_compare.py BUILD_DIR [--rounds 5] [--threads 2] [--min-time 0.5]
      [--candidates-dir /opt/shardline/candidates] [--install-candidates] [--only NAME,...]
      [--torch-python /opt/shardline-bench/torch2/bin/python] [--json FILE]

On the three GPT-2-small GEMM shapes of bench/gemm_bench.cc (2048 rows; qkv 768->2304, fc
768->3072, fc_proj 3072->768; out = inp . weight^T, row-major, as kernels/cpu/matmul.cc calls it),
runs, --rounds times and interleaved so that every side sees the same machine state:

  - BUILD_DIR/bench/gemm_bench as built: kernels::cpu::Sgemm(), whatever library
    kernels/cpu/blas.cc chose (its description is printed), and MatmulForward on top of it;
  - BUILD_DIR/bench/gemm_bench once per candidate library, selected with GEMM_BENCH_LIBRARY and
    GEMM_BENCH_SYMBOL (one library per process; the candidate checks its own result);
  - the peer: torch.mm(inp, weight.t()) in PyTorch 2 (the venv's torch, MKL inside; Debian's
    /usr/bin/python3 torch if the venv is absent), with torch.set_num_threads(THREADS).

Every side gets the same thread count: OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS and
BLIS_NUM_THREADS are all set to --threads. Each round's figure is one gemm_bench measurement
(Google Benchmark's mean over --min-time seconds of calls) or, for the peer, the mean over the same
time; the table prints the MEDIAN over the rounds and, in brackets, the BEST round, then the ratios
median/median(peer) and best/best(peer), against the peer's version printed beside them. On a shared
machine each measurement first waits (up to --quiet-wait seconds) for the cores to go idle, and is
tried again (up to --attempts times, keeping the least disturbed) when other processes used more
than --max-interference of a core while it ran (/proc/stat's busy time less the children's own);
the table says how many measurements stayed disturbed.

Candidates are looked for under --candidates-dir; a missing one is skipped (and said so).
--install-candidates puts them there first, with the ordinary clients and no system change:
pip install --prefix (mkl-devel, onednn-devel), pip install --target (scipy-openblas32), and
apt-get download + dpkg-deb -x (Debian's BLIS, both threading flavours, and oneDNN when
libdnnl2 is not installed). Debian's OpenBLAS and oneDNN come from the system as installed.
"""
import argparse
import glob
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

SHAPES = [("qkv", 768, 2304), ("fc", 768, 3072), ("fc_proj", 3072, 768)]
ROWS = 2048
MULTIARCH = "/usr/lib/x86_64-linux-gnu"

PEER = r"""
import json, re, sys, time
import torch
threads, min_time = int(sys.argv[1]), float(sys.argv[2])
torch.set_num_threads(threads)
config = torch.__config__.show()
m = re.search(r"Math Kernel Library Version ([^\s]+)", config)
out = {"version": torch.__version__, "mkl": bool(torch.backends.mkl.is_available()),
       "mkl_version": m.group(1) if m else None, "threads": torch.get_num_threads(), "gflops": {}}
for name, c, oc in json.loads(sys.argv[3]):
    a = torch.full((2048, c), 0.5)
    w = torch.full((oc, c), 0.25)
    y = torch.empty(2048, oc)
    for _ in range(3):
        torch.mm(a, w.t(), out=y)
    n, start = 0, time.perf_counter()
    while True:
        torch.mm(a, w.t(), out=y)
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time and n >= 3:
            break
    assert float(y[0, 0]) == 0.125 * c
    out["gflops"][name] = 2.0 * 2048 * c * oc * n / elapsed / 1e9
print(json.dumps(out))
"""


def lib_dir(prefix):
    """pip --prefix puts libraries in PREFIX/lib, or PREFIX/local/lib with Debian's pip."""
    for d in (os.path.join(prefix, "lib"), os.path.join(prefix, "local", "lib")):
        if os.path.isdir(d):
            return d
    return os.path.join(prefix, "lib")


def dist_version(prefix, dist):
    hits = glob.glob(os.path.join(prefix, "**", f"{dist}-*.dist-info"), recursive=True)
    return hits[0].rsplit("/", 1)[1][len(dist) + 1:-len(".dist-info")] if hits else "?"


def dpkg_version(package):
    p = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True,
                       text=True)
    return p.stdout.strip() if p.returncode == 0 and p.stdout.strip() else None


def file_version(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"


def candidates(d):
    """(name, version, library, symbol, extra env) for each candidate; library None if absent."""
    out = []
    openblas = "libopenblas.so.0"
    ob_ver = dpkg_version("libopenblas0-pthread") or dpkg_version("libopenblas0")
    have_ob = ob_ver is not None
    out.append(("openblas-debian (own detection)", f"OpenBLAS {ob_ver}", openblas if have_ob else None,
                "cblas_sgemm", {}))
    for core in ("SkylakeX", "Cooperlake"):
        out.append((f"openblas-debian CORETYPE={core}", f"OpenBLAS {ob_ver}",
                    openblas if have_ob else None, "cblas_sgemm", {"OPENBLAS_CORETYPE": core}))
    sp = os.path.join(d, "scipy-openblas32")
    lib = os.path.join(sp, "scipy_openblas32", "lib", "libscipy_openblas.so")
    out.append(("scipy-openblas32 (PyPI)", f"OpenBLAS {dist_version(sp, 'scipy_openblas32')}",
                lib if os.path.exists(lib) else None, "scipy_cblas_sgemm", {}))
    mkl = os.path.join(d, "mkl-devel")
    mdir = lib_dir(mkl)
    lib = os.path.join(mdir, "libmkl_rt.so.2" if not os.path.exists(
        os.path.join(mdir, "libmkl_rt.so.3")) else "libmkl_rt.so.3")
    for layer, what in (("GNU", "GNU OpenMP"), ("INTEL", "Intel OpenMP")):
        out.append((f"mkl (PyPI) {what}", f"MKL {dist_version(mkl, 'mkl')}",
                    lib if os.path.exists(lib) else None, "cblas_sgemm",
                    {"MKL_THREADING_LAYER": layer, "LD_LIBRARY_PATH": mdir}))
    for flavour in ("openmp", "pthread"):
        root = os.path.join(d, f"blis-{flavour}")
        lib = os.path.join(root, MULTIARCH.lstrip("/"), f"blis-{flavour}", "libblis.so.4")
        out.append((f"blis-debian {flavour}", f"BLIS {file_version(os.path.join(root, 'VERSION'))}",
                    lib if os.path.exists(lib) else None, "cblas_sgemm", {}))
    dn_ver = dpkg_version("libdnnl2")
    if dn_ver:
        out.append(("onednn-debian (GNU OpenMP)", f"oneDNN {dn_ver}", "libdnnl.so.2", "dnnl_sgemm",
                    {}))
    else:
        root = os.path.join(d, "onednn-debian")
        ldir = os.path.join(root, MULTIARCH.lstrip("/"))
        lib = os.path.join(ldir, "libdnnl.so.2")
        out.append(("onednn-debian (GNU OpenMP)",
                    f"oneDNN {file_version(os.path.join(root, 'VERSION'))}",
                    lib if os.path.exists(lib) else None, "dnnl_sgemm", {"LD_LIBRARY_PATH": ldir}))
    dn = os.path.join(d, "onednn-devel")
    ddir = lib_dir(dn)
    lib = os.path.join(ddir, "libdnnl.so.3")
    out.append(("onednn (PyPI, TBB)", f"oneDNN {dist_version(dn, 'onednn')}",
                lib if os.path.exists(lib) else None, "dnnl_sgemm", {"LD_LIBRARY_PATH": ddir}))
    return out


def install_candidates(d):
    os.makedirs(d, exist_ok=True)
    pip = [sys.executable, "-m", "pip",
           "install", "--quiet", "--no-compile", "--disable-pip-version-check",
           "--no-warn-script-location"]
    for dist, how in (("mkl-devel", "--prefix"), ("onednn-devel", "--prefix"),
                      ("scipy-openblas32", "--target")):
        dest = os.path.join(d, dist)
        if os.path.isdir(dest):
            continue
        extra = ["--ignore-installed"] if how == "--prefix" else []
        subprocess.run(pip + extra + [how, dest, dist], check=True)
    debs = [("blis-openmp", "libblis4-openmp"), ("blis-pthread", "libblis4-pthread")]
    if not dpkg_version("libdnnl2"):
        debs.append(("onednn-debian", "libdnnl2"))
    for name, package in debs:
        dest = os.path.join(d, name)
        if os.path.isdir(dest):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o777)  # apt-get download runs as _apt where it can
            subprocess.run(["apt-get", "download", "-q", package], cwd=tmp, check=True)
            deb = glob.glob(os.path.join(tmp, "*.deb"))[0]
            os.makedirs(dest)
            subprocess.run(["dpkg-deb", "-x", deb, dest], check=True)
            version = subprocess.run(["dpkg-deb", "-f", deb, "Version"], capture_output=True,
                                     text=True, check=True).stdout.strip()
            with open(os.path.join(dest, "VERSION"), "w") as f:
                f.write(version + "\n")


def cpu_busy(interval):
    """The fraction of all cores' time spent busy over the next interval seconds (/proc/stat)."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    t0, i0 = sample()
    time.sleep(interval)
    t1, i1 = sample()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def wait_quiet(max_wait, threshold=0.1):
    """Waits (up to max_wait s) until other processes leave the cores idle; True if they did."""
    deadline = time.monotonic() + max_wait
    while True:
        if cpu_busy(0.5) <= threshold:
            return True
        if time.monotonic() >= deadline:
            return False


def thread_env(threads, extra=None):
    env = dict(os.environ)
    for k in ("GEMM_BENCH_LIBRARY", "GEMM_BENCH_SYMBOL", "OPENBLAS_CORETYPE",
              "MKL_THREADING_LAYER"):
        env.pop(k, None)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
        env[k] = str(threads)
    for k, v in (extra or {}).items():
        if k == "LD_LIBRARY_PATH" and env.get(k):
            v = v + ":" + env[k]
        env[k] = v
    return env


def busy_seconds():
    """CPU seconds all cores have spent busy since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def measured_run(cmd, env):
    """Runs cmd; returns (CompletedProcess, cores that OTHER processes kept busy meanwhile)."""
    def child_cpu():
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime
    busy0, own0, t0 = busy_seconds(), child_cpu(), time.monotonic()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    busy1, own1, t1 = busy_seconds(), child_cpu(), time.monotonic()
    return p, max(0.0, (busy1 - busy0) - (own1 - own0)) / max(1e-3, t1 - t0)


def run_bench(bench, env, min_time, filt):
    """(figures or None, description or error, interference in cores)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [bench, f"--benchmark_min_time={min_time}", f"--benchmark_filter={filt}",
               f"--benchmark_out={out.name}", "--benchmark_out_format=json"]
        p, other = measured_run(cmd, env)
        if p.returncode != 0:
            return None, (p.stdout + p.stderr)[-2000:], other
        with open(out.name) as f:
            data = json.load(f)
    res = {}
    for b in data["benchmarks"]:
        if b.get("error_occurred"):
            return None, f"{b['name']}: {b.get('error_message')}", other
        name = b["name"].split("/real_time")[0]
        res[name] = b["GFLOP/s"]
    m = re.search(r"ours vs the sgemm it calls \((.*)\)\n", p.stdout)
    return res, (m.group(1) if m else ""), other


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("build_dir")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-time", type=float, default=0.5, help="seconds of calls per measurement")
    p.add_argument("--candidates-dir", default="/opt/shardline/candidates")
    p.add_argument("--install-candidates", action="store_true")
    p.add_argument("--only", default="", help="comma-separated substrings of candidate names")
    p.add_argument("--torch-python", default=None,
                   help="default: /opt/shardline-bench/torch2/bin/python, else /usr/bin/python3")
    p.add_argument("--json", default=None, help="write every round's figures here")
    p.add_argument("--quiet-wait", type=float, default=30.0,
                   help="before each measurement, wait up to this many seconds for the cores to "
                        "be idle (a shared machine); 0: don't")
    p.add_argument("--attempts", type=int, default=3,
                   help="tries per measurement while other processes disturb it; the least "
                        "disturbed one is kept")
    p.add_argument("--max-interference", type=float, default=0.1,
                   help="cores of other processes' CPU time during a measurement that still "
                        "counts as undisturbed")
    a = p.parse_args()

    bench = os.path.join(a.build_dir, "bench", "gemm_bench")
    if not os.access(bench, os.X_OK):
        sys.exit(f"gemm_compare: no {bench} (ninja -C {a.build_dir} gemm_bench)")
    if a.install_candidates:
        install_candidates(a.candidates_dir)
    torch_python = a.torch_python
    if torch_python is None:
        torch_python = "/opt/shardline-bench/torch2/bin/python"
        if not os.access(torch_python, os.X_OK):
            torch_python = "/usr/bin/python3"

    only = [s for s in a.only.split(",") if s]
    cands = [c for c in candidates(a.candidates_dir)
             if not only or any(s.lower() in c[0].lower() for s in only)]
    for c in cands:
        if c[2] is None:
            print(f"skipped (not installed): {c[0]}")
    cands = [c for c in cands if c[2] is not None]

    # sides: "build", each candidate, "peer"
    sides = ["build"] + [c[0] for c in cands] + ["peer"]
    figures = {s: {shape: [] for shape, _, _ in SHAPES} for s in sides}
    ours = {shape: [] for shape, _, _ in SHAPES}
    ours_bias = {shape: [] for shape, _, _ in SHAPES}
    state = {"build_desc": "", "peer_info": None}
    failed, disturbed, kept = {}, 0, 0
    shapes_json = json.dumps(SHAPES)

    def measure(side):
        """({(table, key): GFLOP/s}, interference) for one run of side; None if it failed."""
        if side == "peer":
            proc, other = measured_run([torch_python, "-c", PEER, str(a.threads),
                                        str(a.min_time), shapes_json], thread_env(a.threads))
            if proc.returncode != 0:
                sys.exit(f"gemm_compare: the peer failed:\n{proc.stderr[-2000:]}")
            state["peer_info"] = json.loads(proc.stdout.strip().splitlines()[-1])
            return {("peer", shape): state["peer_info"]["gflops"][shape]
                    for shape, _, _ in SHAPES}, other
        if side == "build":
            res, desc, other = run_bench(bench, thread_env(a.threads), a.min_time, ".")
            if res is None:
                sys.exit(f"gemm_compare: {bench} failed: {desc}")
            state["build_desc"] = desc
            out = {}
            for shape, _, _ in SHAPES:
                out[("build", shape)] = res[f"Sgemm/{shape}"]
                out[("ours", shape)] = res[f"MatmulForward/{shape}"]
                out[("ours_bias", shape)] = res[f"MatmulForwardBias/{shape}"]
            return out, other
        _, _, lib, sym, extra = next(c for c in cands if c[0] == side)
        env = thread_env(a.threads, extra)
        env["GEMM_BENCH_LIBRARY"] = lib
        env["GEMM_BENCH_SYMBOL"] = sym
        res, err, other = run_bench(bench, env, a.min_time, "^Candidate/")
        if res is None:
            failed[side] = err.strip().splitlines()[-1] if err.strip() else "failed"
            return None
        return {(side, shape): res[f"Candidate/{shape}"] for shape, _, _ in SHAPES}, other

    for r in range(a.rounds):
        order = sides[r % len(sides):] + sides[:r % len(sides)]  # rotate: no fixed position
        for side in order:
            if side in failed:
                continue
            best = None  # of the attempts, the one other processes disturbed least
            for _ in range(a.attempts):
                if a.quiet_wait > 0:
                    wait_quiet(a.quiet_wait)
                got = measure(side)
                if got is None:
                    break
                if best is None or got[1] < best[1]:
                    best = got
                if got[1] <= a.max_interference:
                    break
            if best is None:
                continue
            kept += 1
            if best[1] > a.max_interference:
                disturbed += 1
            for (table, shape), v in best[0].items():
                if table == "ours":
                    ours[shape].append(v)
                elif table == "ours_bias":
                    ours_bias[shape].append(v)
                else:
                    figures[table][shape].append(v)
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)

    build_desc, peer_info = state["build_desc"], state["peer_info"]
    peer_label = (f"torch {peer_info['version']}, MKL {peer_info['mkl_version']}"
                  f"{'' if peer_info['mkl'] else ' (torch.backends.mkl unavailable)'}")
    versions = {c[0]: c[1] for c in cands}
    versions["build"] = build_desc
    names = {"build": "shardline Sgemm() as built", "peer": "PyTorch 2 torch.mm (peer)"}
    peer_med = {shape: statistics.median(figures["peer"][shape]) for shape, _, _ in SHAPES}
    peer_best = {shape: max(figures["peer"][shape]) for shape, _, _ in SHAPES}

    def cell(v, shape, ratio=True):
        text = f"{statistics.median(v):6.1f} [{max(v):6.1f}]"
        if ratio:
            text += (f" x{statistics.median(v) / peer_med[shape]:.2f}"
                     f"/{max(v) / peer_best[shape]:.2f}")
        return text

    print(f"\nGEMM {ROWS} rows, {a.threads} threads, {a.rounds} rounds of {a.min_time} s each: "
          "GFLOP/s median [best]; ratio = median / peer's median")
    print(f"{disturbed} of the {kept} measurements kept had other processes busy on more than "
          f"{a.max_interference} of a core while they ran (after {a.attempts} attempts each)")
    print(f"peer: {torch_python}: {peer_label} (torch threads {peer_info['threads']})")
    header = f"{'candidate':36} {'library':34}"
    for shape, c, oc in SHAPES:
        header += f" {shape + f' {c}->{oc}':>30}"
    print(header)
    for side in sides:
        if side in failed:
            print(f"{names.get(side, side):36} {versions.get(side, ''):34} FAILED: {failed[side]}")
            continue
        line = f"{names.get(side, side):36} {versions.get(side, '')[:34]:34}"
        for shape, _, _ in SHAPES:
            line += f" {cell(figures[side][shape], shape, side != 'peer'):>30}"
        print(line)
    print(f"(ratios x median/best, every one against {peer_label})")
    print(f"\nshardline Sgemm() as built: {build_desc}")
    for label, src in (("MatmulForward", ours), ("MatmulForward+bias", ours_bias)):
        line = f"{label:36} {'':34}"
        for shape, _, _ in SHAPES:
            line += f" {cell(src[shape], shape):>30}"
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"peer": peer_info, "peer_python": torch_python, "build": build_desc,
                       "versions": versions, "figures": figures, "ours": ours,
                       "ours_bias": ours_bias, "failed": failed, "threads": a.threads,
                       "rounds": a.rounds, "min_time": a.min_time}, f, indent=1)


if __name__ == "__main__":
    main()
