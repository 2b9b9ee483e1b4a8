#!/usr/bin/env bash
# Call d4: q1 = main (n4's kernels) with QK-norm inside the fused decode attention kernel
# (`attend_rope_d<D>` norms each head of q and K as `rms_norm` would, before RoPE; two launches a
# layer fewer on Gemma 3 and Qwen3). gpu-check q1 on gemma3-270m (head size 256, QK-norm: the tile
# checks' new QK-norm comparison at every head size, greedy against the CPU, the hashes across chunk
# sizes 1, 64 and 512, where only chunks of one row take the fused kernel) beside the 27B's
# synthesis; then tg128 on the Gemma-3-27B-shaped Q4_K_M n4 q1 L q1 n4 (three repetitions; L =
# llama-bench -ngl 99 -fa 1, built in call c1) and on gemma3-270m n4 q1 q1 n4; q1's 27B timeline.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/lcb/bin; export TANDEM_KERNEL_CACHE=$W/k
N4=.gpu/tandem-n4; Q1=.gpu/tandem-q1; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
cat .gpu/llama-build/llama-build.tgz.part-* | tar -xzf - -C $W/lcb/bin; LB=$W/lcb/bin/llama-bench
( $Q1 synth --arch gemma3 --shape gemma3-27b --quant q4_k_m --seed 1 -o $W/g27.gguf 2>&1 | tail -1 ) & P27=$!
$Q1 synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 240 $Q1 gpu-check -m $W/g.gguf > $OUT/check-g.md 2>$W/check-g.err; echo "check g exit $? $(el)"
echo "== check-g"; grep "| NO |" $OUT/check-g.md | cut -c1-300; grep -c "| yes |" $OUT/check-g.md; grep "sha256\|greedy\|replay" $OUT/check-g.md | cut -c1-240
grep "fused RoPE" $OUT/check-g.md | head -3 | cut -c1-400
wait $P27; echo "27b synth done $(el)"
export LD_LIBRARY_PATH=$W/lcb/bin:$LD_LIBRARY_PATH
tg() { echo "$1 $2 $($3 bench -m $W/$2.gguf --device cuda -p 0 -n 128 -r $4 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
lt() { echo "llama $1 $($LB -m $W/$1.gguf -ngl 99 -fa 1 -p 0 -n 128 -r $2 -o csv 2>>$W/llama.err | tail -1 | awk -F, '{print $(NF-1), $NF}')"; }
{ tg n4 g27 $N4 3; tg q1 g27 $Q1 3; lt g27 3; tg q1 g27 $Q1 3; tg n4 g27 $N4 3; echo "at $(el)"
  tg n4 g $N4 6; tg q1 g $Q1 6; tg q1 g $Q1 6; tg n4 g $N4 6; echo "at $(el)"; } > $W/tg.txt 2>&1
cat $W/tg.txt >> $R
TANDEM_CUDA_TRACE=$W/trace.tsv timeout 90 $Q1 bench -m $W/g27.gguf --device cuda -p 0 -n 64 -r 1 2>>$W/trace.err | grep tg64
python3 scripts/trace_summary.py $W/trace.tsv --sequence 16 > $W/timeline.md 2>&1; echo "== timeline q1 g27" >> $R; cat $W/timeline.md >> $R
head -20 $W/timeline.md | cut -c1-110; tail -3 $W/llama.err; cat $W/tg.txt; echo "total $(el)"
