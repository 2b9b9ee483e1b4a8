#!/usr/bin/env bash
# Sourced on the GPU machine: puts the driver, NVRTC and cuBLAS where the dynamic loader (and so
# cudarc) finds them, wherever this image keeps them (driver mount, CUDA toolkit, pip wheels).
dirs=""
for pattern in 'libcuda.so*' 'libnvrtc.so*' 'libcublas.so*' 'libcublasLt.so*'; do
  d=$(find /usr/local/nvidia /usr/local/cuda /usr/lib/x86_64-linux-gnu /opt -name "$pattern" 2>/dev/null \
      | grep -v stubs | head -1 | xargs -r dirname)
  [ -n "$d" ] && dirs="$dirs:$d"
done
export LD_LIBRARY_PATH="${dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
