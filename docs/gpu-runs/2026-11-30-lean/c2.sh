#!/usr/bin/env bash
# Call c2: n2 = n1 with the decode graphs' logits lent from page-locked memory (no copy into a
# vector); n3 = n2 with each lane's weight read positions formed once per row (Q4_K, Q6_K, Q8_0).
# gpu-check n3 on gemma3-270m and the 8B Q4_K_M + Q8_0 (hashes at 600; the kernels' integers did
# not change, so they must be main's); tg128 n1 n2 n3 n3 n2 n1 on Q8_0 and Q4_K_M (six repetitions);
# n3's timelines (with each launch of a pass) and host times per replay on Q8_0.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N1=.gpu/tandem-n1; N2=.gpu/tandem-n2; N3=.gpu/tandem-n3; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
( $N3 synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & P4=$!
( $N3 synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) & P8=$!
$N3 synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
wait $P4 $P8; echo "synth done $(el)"
timeout 150 $N3 gpu-check -m $W/g.gguf > $OUT/check-g.md 2>$W/check-g.err; echo "check g exit $? $(el)"
timeout 200 $N3 gpu-check -m $W/q4.gguf -m $W/q8.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$W/check-8b.err; echo "check 8b exit $? $(el)"
for f in check-g check-8b; do echo "== $f"; grep "| NO |" $OUT/$f.md | cut -c1-240; grep -c "| yes |" $OUT/$f.md; grep "sha256\|greedy\|replay" $OUT/$f.md | cut -c1-240; done
tg() { local l=$1 bin=$2 f=$3; echo "$l $f $($bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 6 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ for m in q8 q4; do tg n1 $N1 $m; tg n2 $N2 $m; tg n3 $N3 $m; tg n3 $N3 $m; tg n2 $N2 $m; tg n1 $N1 $m; done; } > $W/tg.txt 2>&1
echo "tg done $(el)"; cat $W/tg.txt >> $R
for m in q8 q4; do TANDEM_CUDA_TRACE=$W/trace-$m.tsv timeout 90 $N3 bench -m $W/$m.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace-$m.err | grep tg128; tail -3 $W/trace-$m.err
python3 scripts/trace_summary.py $W/trace-$m.tsv --sequence 12 > $W/timeline-$m.md 2>&1; echo "== timeline n3 $m" >> $R; cat $W/timeline-$m.md >> $R; done
TANDEM_CUDA_PASS_TIMES=1 timeout 60 $N3 bench -m $W/q8.gguf --device cuda -p 0 -n 128 -r 1 2>$W/pass-q8.txt | grep tg128
grep "replay us" $W/pass-q8.txt | tail -100 | python3 -c "
import sys,statistics as st
rows=[l.split() for l in sys.stdin]
print('host us per replay (median of', len(rows), 'steps, Q8_0):', ' '.join(f'{k} {st.median(float(r[i]) for r in rows):.1f}' for i,k in [(3,'dry'),(5,'upload'),(7,'launch'),(9,'wait'),(11,'copy')]))" >> $R
$N3 bench -m $W/q8.gguf --device cuda -p 0 -n 16 -r 1 -v 2>&1 | grep "decode kernel" | head -12 >> $R
head -16 $W/timeline-q8.md | cut -c1-110; grep "^| [0-9]* |" $W/timeline-q8.md | head -12; head -5 $W/timeline-q4.md | cut -c1-110; cat $W/tg.txt; tail -14 $R | grep -v "^| [0-9]* |" | tail -13; echo "total $(el)"
