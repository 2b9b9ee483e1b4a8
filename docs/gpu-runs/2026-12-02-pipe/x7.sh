#!/usr/bin/env bash
# Call x7: binary x7 = main as landed (the pipelined qmma not routed: x6 measured no gain end to
# end), with gpu-check's rows comparing batched decode with each sequence alone. The model checks on
# the synthetic gemma3-270m and 8B Q4_K_M (no kernel checks: x1 ran main's kernels, unchanged since).
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
S=$OUT/summary.txt
gunzip -c .gpu/f/tandem-x7.gz > $W/bin/x7; chmod +x $W/bin/x7; B=$W/bin/x7
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/gemma3-270m.gguf 2>&1 | tail -1
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
echo "synth $(el)" | tee -a $S
timeout 300 $B gpu-check --no-kernel-checks -m $W/gemma3-270m.gguf -m $W/q4.gguf --prompt 300 --gen 16 --hash-prompt 300 > $OUT/check.md 2>$W/check.err
echo "gpu-check: exit $?, $(grep -c '| yes |' $OUT/check.md) yes, $(grep -c '| NO |' $OUT/check.md) NO ($(el))" | tee -a $S
grep -E "\| NO \||decoded together vs" $OUT/check.md | cut -c1-300 | tee -a $S; tail -2 $W/check.err | tee -a $S
echo "===== summary"; cat $S
