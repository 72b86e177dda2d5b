#!/usr/bin/env bash
# Installs every Debian 12 package that Shardline's build, tests and benchmarks need.
# Idempotent and non-interactive; run as root (or through sudo).
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake ninja-build git pkg-config
  # wire: ZeroMQ + Cap'n Proto
  libzmq3-dev cppzmq-dev capnproto libcapnp-dev
  # common libraries
  libabsl-dev libspdlog-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
  # checkpoint checksums (XXH3)
  libxxhash-dev
  # collectives and compute
  libgloo-dev libopenblas-dev libopenmpi-dev openmpi-bin
  # vectorized tanh and exp for the CPU kernels (the library PyTorch's CPU kernels use)
  libsleef-dev
  # monitoring: client library, and the real server + promtool for the monitoring tests
  prometheus-cpp-dev prometheus
  # tests and benchmarks
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  # PyTorch reference checks and peer benchmarks (run with /usr/bin/python3)
  python3 python3-torch python3-numpy
  # process and network tools the fault tests use
  procps iproute2 psmisc
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
