#!/usr/bin/env bash
# Call 2: resident-activation matvecs (n1) checked, kernel-timed, and tg128 A/B against p1 (main before).
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-n1; B=.gpu/tandem-p1
( $N synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1 ) &
$N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
wait; echo "synth done $(date +%T)"
$N bench -v -m $W/q4.gguf --device cuda -p 0 -n 1 -r 1 2>&1 | grep "decode kernel" > $OUT/choices.txt
tg() { local l=$1 bin=$2 f=$3; shift 3; echo "$l $f $(env "$@" $bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ for i in 1 2; do tg n1 $N q4 X=1; tg p1 $B q4 X=1; tg p1 $B q4 X=1; tg n1 $N q4 X=1; done; } > $OUT/tg.txt 2>&1
echo "tg done $(date +%T)"
timeout 150 $N gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$OUT/check.err; echo "check exit $? $(date +%T)"
timeout 200 $N gpu-check --bench-matvec > $OUT/bench-matvec.md 2>$OUT/bench-matvec.err; echo "bench exit $? $(date +%T)"
grep "| no |" $OUT/check.md | cut -c1-200
grep "Int8 Q4_K\|Int8 Q6_K\|sha\|hash" $OUT/check.md | cut -c1-230
grep "Int8" $OUT/bench-matvec.md | grep -v quantize | grep "Q4_K 14336x4096\|Q4_K 4096x4096\|Q4_K 6144x4096\|Q6_K 1024x4096\|Q6_K 128256" | cut -c1-120
cat $OUT/choices.txt $OUT/tg.txt
