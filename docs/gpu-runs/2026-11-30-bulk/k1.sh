#!/usr/bin/env bash
# Call k1: k1 = main + `mmq_q8_0` (exp/mmq-q8-0) + the bulk-fed one-row K-quant matvecs (`mmvqt_*`:
# each warp's next rows copied whole into shared memory by cp.async.bulk on mbarriers). m4 = main's
# decode kernels. gpu-check on the 8B Q4_K_M (every variant's bits, the bulk-fed ones on 80x rows,
# the hash e0cf7d15d85e... across chunk sizes); the load-time choices; tg128 m4 / k1 / k1 with the
# bulk-fed variants forced / the same / k1 / m4. Then the 8B Q8_0: gpu-check (mmq_q8_0's row, its
# deterministic hash across chunks) and deterministic pp512, m4 k1 k1 m4.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/tandem-k1; M=.gpu/tandem-m4; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
$B synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf > $W/synth8.log 2>&1 &
SP=$!
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth q4 done $(el)"
timeout 200 $B gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$W/check-8b.err; echo "check 8b exit $? $(el)"
grep "| NO |" $OUT/check-8b.md | cut -c1-400; grep -c "| yes |" $OUT/check-8b.md; grep "matvec Int8\|sha256\|greedy\|replay" $OUT/check-8b.md | cut -c1-300; tail -3 $W/check-8b.err
$B bench -m $W/q4.gguf --device cuda -p 0 -n 16 -r 1 -v > $W/verbose-q4.txt 2>&1
grep -i "decode kernel\|group" $W/verbose-q4.txt | sort | uniq -c > $OUT/choices-q4.txt; cat $OUT/choices-q4.txt; echo "choices $(el)"
T=u2r1s1t,u4r1s1t
tg() { echo "$1 $(env $2 $3 bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 4 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg m4 "" $M; tg k1 "" $B; tg k1-bulk TANDEM_CUDA_MMVQ=$T $B; tg k1-bulk TANDEM_CUDA_MMVQ=$T $B; tg k1 "" $B; tg m4 "" $M; echo "at $(el)"; } > $W/tg4.txt 2>&1; cat $W/tg4.txt >> $R; cat $W/tg4.txt; tail -3 $W/bench.err
wait $SP; tail -1 $W/synth8.log; echo "synth q8 done $(el)"
timeout 170 $B gpu-check -m $W/q8.gguf --hash-prompt 600 > $OUT/check-q8.md 2>$W/check-q8.err; echo "check q8 exit $? $(el)"
grep "| NO |" $OUT/check-q8.md | cut -c1-400; grep -c "| yes |" $OUT/check-q8.md; grep "tensor cores\|sha256\|greedy" $OUT/check-q8.md | cut -c1-300; tail -3 $W/check-q8.err
pp() { echo "$1 $($2 bench -m $W/q8.gguf --device cuda --deterministic -p 512 -n 0 -r 2 2>>$W/bench.err | grep pp512 | cut -d'|' -f5)"; }
{ pp m4 $M; pp k1 $B; pp k1 $B; pp m4 $M; echo "at $(el)"; } > $W/pp8.txt 2>&1; cat $W/pp8.txt >> $R; cat $W/pp8.txt
echo "total $(el)"
