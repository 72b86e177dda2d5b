#!/usr/bin/env bash
# Installs the pinned Hugging Face transformers that bench/hf_export_check.py loads exported models
# with, into a prefix of its own (never into Debian's Python), from PyPI through Debian's pip.
# transformers is a benchmark-only peer: nothing in ctest needs it.
#
#   bench/setup-hf-check.sh [PREFIX]     default /opt/shardline-bench/hf
#
# Idempotent: a prefix that already holds these pins is left as it is. The pins work with
# Debian 12's python3-torch (1.13) and python3-numpy (1.24), which stay Debian's: every package is
# installed with --no-deps, and the list is what transformers really imports on that path (its
# PyPI dependencies would pull a torch of their own). tokenizers is not used by the check, but
# transformers 4.44 imports it while loading GPT2LMHeadModel.
set -euo pipefail

PREFIX=${1:-/opt/shardline-bench/hf}
PYTHON=/usr/bin/python3
PINS=(
  transformers==4.44.2
  huggingface_hub==0.24.6
  safetensors==0.4.5
  tokenizers==0.19.1
  filelock==3.15.4
  packaging==24.1
  regex==2024.7.24
  tqdm==4.66.5
)
STAMP="$PREFIX/.shardline-pins"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "${PINS[*]}" ]] &&
   PYTHONPATH="$PREFIX" "$PYTHON" -c 'import transformers' 2>/dev/null; then
  echo "setup-hf-check: $PREFIX already holds ${PINS[0]}"
  exit 0
fi

# What Debian provides (torch, numpy, yaml, requests); pip is Debian's too.
missing=()
for pkg in python3-torch python3-numpy python3-yaml python3-requests python3-typing-extensions \
           python3-pip; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi

# Into a fresh folder, then renamed into place: an interrupted run leaves no half-filled prefix.
tmp="$PREFIX.tmp.$$"
rm -rf "$tmp"
mkdir -p "$(dirname "$PREFIX")"
trap 'rm -rf "$tmp"' EXIT
# --target bypasses Debian's externally-managed guard by design: nothing lands in its site-packages.
"$PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
  --no-deps --no-compile --target "$tmp" "${PINS[@]}"
PYTHONPATH="$tmp" "$PYTHON" -c 'from transformers import GPT2LMHeadModel' >/dev/null
echo "${PINS[*]}" > "$tmp/.shardline-pins"
rm -rf "$PREFIX"
mv "$tmp" "$PREFIX"
trap - EXIT
echo "setup-hf-check: installed ${PINS[*]} into $PREFIX"
