#!/usr/bin/env bash
# Call s6: where the dependency cost of call s5 sits. w8 = w7 with TANDEM_CUDA_NO_WAIT naming kernel
# files: mmvq (the matvecs and the output head do not wait for the small kernels before them),
# ops,attention (add + norm, gating and attention do not wait for the matvecs before them), or 1
# (every kernel). Wrong results; a timing experiment. tg128 on the 8B Q4_K_M, in order then reversed.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-w8; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
tg() { echo "$1 $(env $2 timeout 120 $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 4 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg none ""; tg matvecs TANDEM_CUDA_NO_WAIT=mmvq; tg small TANDEM_CUDA_NO_WAIT=ops,attention; tg all TANDEM_CUDA_NO_WAIT=1;
  tg all TANDEM_CUDA_NO_WAIT=1; tg small TANDEM_CUDA_NO_WAIT=ops,attention; tg matvecs TANDEM_CUDA_NO_WAIT=mmvq; tg none ""; echo "at $(el)"; } > $R 2>&1
cat $R; tail -3 $W/bench.err
echo "total $(el)"
