#!/usr/bin/env bash
# Call b6: b6 = b5 (main) with the integer matvecs' weight loads marked first to leave L2 (and kept
# out of L1): `exp/evict-first`. gpu-check b6 on the 8B Q4_K_M + Q8_0 (hashes at 600; only cache
# hints changed, so they must be b5's); tg128 b5 b6 b6 b5 on Q4_K_M and Q8_0 (six repetitions); b6's
# timeline on Q8_0 and Q4_K_M.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
A=.gpu/tandem-b5; B=.gpu/tandem-b6
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & P4=$!
$B synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1; wait $P4
echo "8b synth done $(( $(date +%s)-T0 )) s"
tg() { local l=$1 bin=$2 f=$3; echo "$l $f $($bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 6 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ for m in q8 q4; do tg b5 $A $m; tg b6 $B $m; tg b6 $B $m; tg b5 $A $m; done; } > $OUT/tg.txt 2>&1
echo "tg done $(( $(date +%s)-T0 )) s"; cat $OUT/tg.txt
for m in q8 q4; do TANDEM_CUDA_TRACE=$W/trace-$m.tsv timeout 40 $B bench -m $W/$m.gguf --device cuda -p 0 -n 128 -r 1 2>>$OUT/trace.err | grep tg128
python3 scripts/trace_summary.py $W/trace-$m.tsv > $OUT/timeline-b6-$m.md 2>&1; head -16 $OUT/timeline-b6-$m.md | cut -c1-110; done
timeout 150 $B gpu-check -m $W/q4.gguf -m $W/q8.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$OUT/check-8b.err; echo "check 8b exit $? $(( $(date +%s)-T0 )) s"
grep "| NO |" $OUT/check-8b.md | cut -c1-240; grep -c "| yes |" $OUT/check-8b.md; grep "sha256\|greedy\|replay" $OUT/check-8b.md | cut -c1-240
echo "total $(( $(date +%s)-T0 )) s"
