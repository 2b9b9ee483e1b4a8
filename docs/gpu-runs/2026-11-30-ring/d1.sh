#!/usr/bin/env bash
# Call d1: r1 = main (n4's kernels) with ring variants of the one-row K-quant matvecs (`mmvqc_*`:
# weights through a per-warp shared-memory ring filled by cp.async, its first steps issued before the
# wait). gpu-check on the 8B Q4_K_M with the rings forced (every variant's bits, the greedy run, the
# hashes across chunk sizes); tg128 n4 r1 rc rc r1 n4 (rc: r1 with only ring variants offered for
# K-quants); the kernels each picks; rc's timeline.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N4=.gpu/tandem-n4; R1=.gpu/tandem-r1; R=$OUT/results.txt; RING="u2r1s1c,u4r1s1c,u8r1s1c"
el() { echo "$(( $(date +%s)-T0 )) s"; }
$R1 synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth done $(el)"
TANDEM_CUDA_MMVQ=$RING timeout 200 $R1 gpu-check -m $W/q4.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$W/check-8b.err; echo "check 8b exit $? $(el)"
echo "== check-8b"; grep "| NO |" $OUT/check-8b.md | cut -c1-240; grep -c "| yes |" $OUT/check-8b.md; grep "sha256\|greedy\|replay\|Int8" $OUT/check-8b.md | cut -c1-260
tg() { local l=$1 bin=$2; shift 2; echo "$l q4 $(env "$@" $bin bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 6 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ tg n4 $N4 X=1; tg r1 $R1 X=1; tg rc $R1 TANDEM_CUDA_MMVQ=$RING; tg rc $R1 TANDEM_CUDA_MMVQ=$RING; tg r1 $R1 X=1; tg n4 $N4 X=1; } > $W/tg.txt 2>&1
echo "tg done $(el)"; cat $W/tg.txt >> $R
for v in r1 rc; do e=X=1; [ $v = rc ] && e=TANDEM_CUDA_MMVQ=$RING
  echo "== decode kernels $v" >> $R; env $e $R1 bench -m $W/q4.gguf --device cuda -p 0 -n 16 -r 1 -v 2>&1 | grep "decode kernel" | head -12 >> $R; done
TANDEM_CUDA_MMVQ=$RING TANDEM_CUDA_TRACE=$W/trace.tsv timeout 90 $R1 bench -m $W/q4.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
python3 scripts/trace_summary.py $W/trace.tsv --sequence 12 > $W/timeline.md 2>&1; echo "== timeline rc q4" >> $R; cat $W/timeline.md >> $R
head -16 $W/timeline.md | cut -c1-110; grep "^| [0-9]* |" $W/timeline.md | head -14; grep -A12 "decode kernels" $R | cut -c1-160; cat $W/tg.txt; echo "total $(el)"
