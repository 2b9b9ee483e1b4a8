#!/usr/bin/env bash
# Call 1 (fused-tails session): gated gate/up matvec checked, then tg128 A/B and leave-one-out timings.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-g1
$N synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
$N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
echo "synth done $(date +%T)"
timeout 230 $N gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$OUT/check.err; echo "check exit $? $(date +%T)"
tg() { local l=$1; shift; echo "$l: $(env "$@" $N bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
configs=("fused X=1" "unfused TANDEM_CUDA_FUSED_TAILS=0" "skip-addnorm TANDEM_CUDA_SKIP=add_norm_to"
  "skip-ropekv TANDEM_CUDA_SKIP=rope_kv_store" "skip-attend TANDEM_CUDA_SKIP=attend_tiles"
  "unfused-skip-gated TANDEM_CUDA_FUSED_TAILS=0 TANDEM_CUDA_SKIP=gated_quant")
for c in "${configs[@]}"; do tg $c; done > $OUT/tg1.txt; echo "tg pass 1 $(date +%T)"
for ((i=${#configs[@]}-1; i>=0; i--)); do tg ${configs[$i]}; done | tac > $OUT/tg2.txt; echo "tg pass 2 $(date +%T)"
TANDEM_CUDA_PROFILE=1 timeout 60 $N bench -m $W/q4.gguf --device cuda -p 0 -n 32 -r 1 > $OUT/profile-tg.txt 2>&1
grep -v "^| matvec\|^| gemm\|^| int8\|^| add_norm\|^| gated_pair\|flash" $OUT/check.md | tail -14 | cut -c1-180
paste $OUT/tg1.txt $OUT/tg2.txt
