#!/usr/bin/env bash
# Call 2: staged matvecs issue their first weight loads before staging the activations; attention
# issues its first K and V loads before staging q. Checked (hashes must not move), then tg128 A/B
# against f1 (6d4d4c9) and leave-one-out timings.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-g2; B=.gpu/tandem-f1
$N synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
$N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
($N synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1) &
echo "synth done $(date +%T)"
timeout 230 $N gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$OUT/check.err; echo "check exit $? $(date +%T)"
wait
tg() { local l=$1 bin=$2 f=$3; shift 3; echo "$l $f: $(env "$@" $bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
for f in q4 q8; do
  tg new $N $f X=1; tg base $B $f X=1; tg base $B $f X=1; tg new $N $f X=1
done > $OUT/ab.txt; echo "ab done $(date +%T)"
configs=("skip-addnorm TANDEM_CUDA_SKIP=add_norm_to" "skip-ropekv TANDEM_CUDA_SKIP=rope_kv_store"
  "skip-attend TANDEM_CUDA_SKIP=attend_tiles" "skip-gated TANDEM_CUDA_SKIP=gated_quant" "none X=1")

for c in "${configs[@]}"; do set -- $c; tg $1 $N q4 $2; done > $OUT/skip1.txt
for ((i=${#configs[@]}-1; i>=0; i--)); do set -- ${configs[$i]}; tg $1 $N q4 $2; done | tac > $OUT/skip2.txt
TANDEM_CUDA_PROFILE=1 timeout 60 $N bench -m $W/q4.gguf --device cuda -p 0 -n 32 -r 1 > $OUT/profile-tg.txt 2>&1
grep -v "^| matvec\|^| gemm\|^| int8\|^| add_norm\|^| gated_pair\|flash" $OUT/check.md | tail -12 | cut -c1-220
cat $OUT/ab.txt; paste $OUT/skip1.txt $OUT/skip2.txt
