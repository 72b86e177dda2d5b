#!/usr/bin/env bash
# Installs the serving benchmark's second peer: llama.cpp's own HTTP server (`llama-server`, with
# continuous batching over --parallel slots), built from the llama.cpp that PyPI's
# llama-cpp-python source package vendors (the machines reach PyPI, not GitHub), and its
# Hugging Face → GGUF converter with the `gguf` package it ships, run by the PyTorch 2 venv of
# bench/setup-torch2.sh (the converter imports torch and transformers). Used by
# bench/serve_compare.py when the server is there. Benchmark-only: nothing in ctest needs it.
#
#   bench/setup-llama-cpp.sh [PREFIX] [VENV]   defaults /opt/shardline-bench/llama.cpp and
#                                              /opt/shardline-bench/torch2
#
# Built for this CPU (GGML_NATIVE), without the web UI, curl or OpenSSL. Idempotent: a prefix
# that holds a working llama-server of this version is kept. About 10 minutes on 2 cores.
set -euo pipefail

PREFIX=${1:-/opt/shardline-bench/llama.cpp}
VENV=${2:-/opt/shardline-bench/torch2}
VERSION=0.3.36  # llama-cpp-python, whose vendor/llama.cpp is built

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "setup-llama-cpp: no venv at $VENV: run bench/setup-torch2.sh first" >&2
  exit 1
fi
if [[ -x "$PREFIX/bin/llama-server" && "$(cat "$PREFIX/VERSION" 2>/dev/null)" == "$VERSION" ]] &&
   "$PREFIX/bin/llama-server" --version >/dev/null 2>&1; then
  echo "setup-llama-cpp: $PREFIX already holds llama-server of llama-cpp-python $VERSION"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$VENV/bin/pip" download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work"
tar xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build "$work/build" --target llama-server -j "$(nproc)" >/dev/null

rm -rf "$PREFIX"
mkdir -p "$PREFIX/bin"
cp "$work/build/bin/llama-server" "$PREFIX/bin/"
# The converter with the modules it imports from its own tree (its gguf-py too, which it puts
# on its path), and what those import that the venv may not have.
cp -r "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$PREFIX/"
# sentencepiece: its Llama's vocabulary step tries a SentencePiece model first and falls back to
# a tokenizer.json or GPT-2's files only on FileNotFoundError, not on the module's absence.
"$VENV/bin/pip" install -q pyyaml tqdm sentencepiece
echo "$VERSION" >"$PREFIX/VERSION"
echo "setup-llama-cpp: $PREFIX holds $("$PREFIX/bin/llama-server" --version 2>&1 | head -1)"
