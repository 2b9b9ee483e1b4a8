#!/usr/bin/env bash
# Call a3: add_norm_to with fewer threads holding float4s (a new summation order): n (1c07cd6 on
# exp/norm-256: 256 threads, up to eight float4s each) and n5 (the same code at 512 threads, four
# float4s) against a (0a70f25, main). gpu-check n on gemma3-270m, the 8B Q4_K_M and Q8_0 (the Q8
# output path); n5 on gemma3-270m. tg128 A B B A on Q4_K_M and Q8_0; n's kernel timeline on Q4_K_M.
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
A=.gpu/tandem-a; N=.gpu/tandem-n; N5=.gpu/tandem-n5
( $A synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) &
( $A synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) &
$A synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 120 $N gpu-check -m $W/g.gguf > $OUT/check-g-n.md 2>$OUT/check-g-n.err; echo "check g n exit $? $(date +%T)"
timeout 120 $N5 gpu-check -m $W/g.gguf > $OUT/check-g-n5.md 2>$OUT/check-g-n5.err; echo "check g n5 exit $? $(date +%T)"
wait; echo "synth done $(date +%T)"
timeout 200 $N gpu-check -m $W/q4.gguf -m $W/q8.gguf --hash-prompt 600 > $OUT/check-8b-n.md 2>$OUT/check-8b-n.err; echo "check 8b n exit $? $(date +%T)"
tg() { local l=$1 bin=$2 f=$3; echo "$l $f $($bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 3 2>>$OUT/bench.err | grep tg128 | cut -d'|' -f5)"; }
{
tg a $A q4; tg n $N q4; tg n5 $N5 q4; tg n5 $N5 q4; tg n $N q4; tg a $A q4
tg a $A q8; tg n $N q8; tg n5 $N5 q8; tg n5 $N5 q8; tg n $N q8; tg a $A q8
} > $OUT/tg.txt 2>&1
echo "tg done $(date +%T)"
TANDEM_CUDA_TRACE=$W/trace-n.tsv timeout 60 $N bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$OUT/trace.err | grep tg128
python3 scripts/trace_summary.py $W/trace-n.tsv > $OUT/timeline-n.md 2>&1
for f in check-g-n check-g-n5 check-8b-n; do echo "== $f"; grep "| NO |" $OUT/$f.md | cut -c1-200; grep -c "| yes |" $OUT/$f.md; grep "add_norm_to\|sha256\|greedy\|replay" $OUT/$f.md | cut -c1-200; done
echo "== timeline n"; head -20 $OUT/timeline-n.md | cut -c1-110
cat $OUT/tg.txt
