#!/usr/bin/env bash
# Build llama.cpp's own speculative decoding tool (llama-speculative-simple) from the source that the
# pinned llama-cpp-python vendors, with the kernels setup.sh builds its wheel with on this CPU, for
# `benchmarks/decode.py --engine llamacpp --llamacpp-speculative`. About 5 CPU-minutes.
#   bash scripts/build_llamacpp_tools.sh [PYTHON]   (PYTHON: whose pip downloads the source; default .venv's)
# Puts the tool in $SPECROUTE_LLAMACPP_TOOLS (default ~/.cache/specroute/llamacpp-tools/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/llamacpp.sh
py="${1:-.venv/bin/python}"
variant="$(llamacpp_variant)"
out="${SPECROUTE_LLAMACPP_TOOLS:-$HOME/.cache/specroute/llamacpp-tools/bin}"
work="${SPECROUTE_CACHE:-$HOME/.cache/specroute}/llamacpp-tools/src-$variant"
mkdir -p "$out" "$work"
if [ ! -d "$work/llama_cpp_python-$LLAMACPP_VERSION" ]; then
  echo "[tools] downloading llama-cpp-python==$LLAMACPP_VERSION's source"
  "$py" -m pip download -q --no-deps --no-binary :all: -d "$work" "llama-cpp-python==$LLAMACPP_VERSION"
  tar -xzf "$work/llama_cpp_python-$LLAMACPP_VERSION.tar.gz" -C "$work"
fi
src="$work/llama_cpp_python-$LLAMACPP_VERSION/vendor/llama.cpp"
echo "[tools] building llama-speculative-simple ($variant kernels) in $work/build"
# shellcheck disable=SC2046  # the flags are words
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release $(llamacpp_cmake_args "$variant") \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF >"$work/cmake.log" 2>&1 \
  || { tail -n 30 "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/build" --target llama-speculative-simple -j "$(nproc)" >"$work/build.log" 2>&1 \
  || { tail -n 30 "$work/build.log" >&2; exit 1; }
cp "$work/build/bin/llama-speculative-simple" "$out/"
echo "[tools] ready: $out/llama-speculative-simple"
