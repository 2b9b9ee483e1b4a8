#!/usr/bin/env bash
# Call f4 (the fuse session): binary f4 = f3 with down's waits made a warp's (f3: 0.822x; direct
# launches: fused gate + up 23.8 us against 26.5 chained with the gating, but down 31.2 / 18.9 us
# against 18.8 / 14.1, its lanes each reading 16 flags; in the graph thousands of spinning lanes):
# a warp reads 32 flags at once, a lane each, only when a step needs a block past those it has
# seen, and while it waits lane 0 alone polls. Every kernel check (the new fused-FFN row among them) while the 8B Q4_K_M and
# gemma3-270m are written; tg128 on the 8B with the fused route on and off (TANDEM_CUDA_FUSED_FFN,
# same binary), on off off on on off off on; the op profile of a few steps (which kernels run); score
# hashes at chunk 1 with the route on and off; the model checks on both models.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
S=$OUT/summary.txt; R=$OUT/results.txt
gunzip -c .gpu/f/tandem-f4.gz > $W/bin/f4; chmod +x $W/bin/f4; B=$W/bin/f4
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader | tee -a $S
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf > $W/synth.log 2>&1
  $B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/gemma3-270m.gguf >> $W/synth.log 2>&1 ) &
SYN=$!
timeout 240 $B gpu-check > $OUT/kernels.md 2>$W/kernels.err
echo "kernel checks: exit $?, $(grep -c '| yes |' $OUT/kernels.md) yes, $(grep -c '| NO |' $OUT/kernels.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/kernels.md | cut -c1-400 | tee -a $S; grep -i "fused decode FFN\|gated" $OUT/kernels.md | cut -c1-500 | tee -a $S
tail -3 $W/kernels.err | tee -a $S
wait $SYN; tail -2 $W/synth.log; echo "synth done $(el)" | tee -a $S
if ! grep -q "^| fused decode FFN .*| yes |$" $OUT/kernels.md; then echo "fused FFN check did not pass: stopping"; cat $S; exit 1; fi
timeout 90 env TANDEM_CUDA_PROFILE=1 $B bench -m $W/q4.gguf --device cuda -v -p 0 -n 8 -r 1 > $OUT/profile.txt 2>&1
grep -iE "ffn|published|gated|decode kernel (14336|4096x14336)" $OUT/profile.txt | cut -c1-200 | head -12 | tee -a $S
timeout 90 env TANDEM_CUDA_PROFILE=1 TANDEM_CUDA_FUSED_FFN=0 $B bench -m $W/q4.gguf --device cuda -p 0 -n 8 -r 1 > $OUT/profile-off.txt 2>&1
grep -iE "14336|gated" $OUT/profile-off.txt | cut -c1-200 | head -6 | tee -a $S
run() { local l=$1 v=$2; echo "== $l $(el)" >> $R; timeout 75 env TANDEM_CUDA_FUSED_FFN=$v $B bench -m $W/q4.gguf --device cuda -r 5 --output-format json -p 0 -n 128 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], r["test"], round(r["tok_s"],1))' $l | tee -a $R; }
for l in on off off on on off off on; do case $l in on) run on 1;; off) run off 0;; esac; done
tail -3 $W/bench.err | tee -a $S
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3 and not line.startswith("=="): v[f[0]].append(float(f[2]))
on, off = v.get("on", []), v.get("off", [])
if on and off:
    a, b = statistics.median(on), statistics.median(off)
    print(f"| 8B Q4_K_M tg128 | fused {a:.1f} | chained {b:.1f} | {a/b:.3f}x | {' / '.join('%.1f' % x for x in on)} | {' / '.join('%.1f' % x for x in off)} |")
    print(f"whole file 4.92 GB at 4.3 TB/s: fused {a*4.92/4300*100:.1f}%, chained {b*4.92/4300*100:.1f}%")
PY
echo "hashes $(el)" | tee -a $S
python3 -c "print(' '.join(['the quick brown fox jumps over the lazy dog']*30))" > $W/prompt.txt
for v in 1 0; do timeout 60 env TANDEM_CUDA_FUSED_FFN=$v $B score -m $W/q4.gguf --device cuda --prompt-file $W/prompt.txt --prefill-chunk 1 --json 2>>$W/score.err | python3 -c "import json,sys; d=json.load(sys.stdin); print('score chunk 1 fused=$v', d['n_tokens'], d['logits_sha256'])" | tee -a $S; done
timeout 200 $B gpu-check --no-kernel-checks -m $W/q4.gguf -m $W/gemma3-270m.gguf --prompt 300 --gen 16 --hash-prompt 300 > $OUT/check.md 2>$W/check.err
echo "model checks: exit $?, $(grep -c '| yes |' $OUT/check.md) yes, $(grep -c '| NO |' $OUT/check.md) NO ($(el))" | tee -a $S
grep -E "\| NO \|" $OUT/check.md | cut -c1-300 | tee -a $S; tail -2 $W/check.err | tee -a $S
echo "all done $(el)"; echo "===== summary"; cat $S
