#!/usr/bin/env bash
# llama.cpp builds for this CPU, shared by setup.sh (the llama-cpp-python wheel) and
# build_llamacpp_tools.sh (llama.cpp's own tools, built from the same source with the same kernels).
# Sourced, not run. Two variants, chosen from /proc/cpuinfo (never -march=native: a wheel built that
# way on one CPU kind may not run on another, and the machines range from AVX2-only EPYCs to AMX Xeons):
#   avx512: AVX-512 F/CD/BW/DQ/VL + VBMI + VNNI + BF16 kernels (Intel Sapphire Rapids and later, AMD Zen 4
#           and later); AMX left off: ggml's AMX path crashes on Q4_K_M weights (ggml-org/llama.cpp#20824);
#   avx2:   AVX2/FMA/F16C, runs on every x86-64 CPU with AVX2.
# Each variant's wheel is kept in its own folder (pip's cache would hand back a wheel built with other
# flags), so a machine of another kind builds and keeps its own.
LLAMACPP_VERSION=0.3.36
LLAMACPP_WHEELS="${SPECROUTE_CACHE:-$HOME/.cache/specroute}/wheels"

llamacpp_variant() {  # avx512 | avx2, from the CPU's flags
  local flags need
  flags=" $(grep -m1 '^flags' "${SPECROUTE_CPUINFO:-/proc/cpuinfo}" 2>/dev/null | cut -d: -f2) "
  for need in avx512f avx512cd avx512bw avx512dq avx512vl avx512vbmi avx512_vnni avx512_bf16; do
    case "$flags" in *" $need "*) ;; *) echo avx2; return;; esac
  done
  echo avx512
}

llamacpp_cmake_args() {  # the CMake flags of a variant
  local common="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  case "$1" in
    avx512) echo "$common -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON" \
      "-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF";;
    *) echo "$common";;
  esac
}
