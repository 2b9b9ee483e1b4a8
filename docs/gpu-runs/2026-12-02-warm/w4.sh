#!/usr/bin/env bash
# Call w4: binary w4 = w3 + prefill chunks on the stacked q/k/v GEMM cut, rotated and stored by one
# `split_rope_kv_store` (project.rs; TANDEM_CUDA_FUSED_QKV_STORE=0 takes the four-launch route).
# Kernel checks (the new kernel bit for bit against split_columns + rope + kv_store), gemma3-270m and
# the 8B Q4_K_M end to end; `tandem score` logits hashes with the fused route on and off (1,500-token
# prompt, chunks of 512 and of 100); the 8B Q4_K_M prefill on / off, on off off on.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
R=$OUT/results.txt; S=$OUT/summary.txt
gunzip -c .gpu/f/tandem-w4.gz > $W/bin/w4; chmod +x $W/bin/w4; B=$W/bin/w4
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
timeout 200 $B gpu-check -m $W/g.gguf --hash-prompt 600 > $OUT/kernels.md 2>$W/kernels.err
echo "kernel checks + gemma: exit $?, $(grep -c '| yes |' $OUT/kernels.md) yes, $(grep -c '| NO |' $OUT/kernels.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/kernels.md | cut -c1-300 | tee -a $S; grep -i "split + rope\|greedy\|sha256" $OUT/kernels.md | cut -c1-260 | tee -a $S
tail -2 $W/kernels.err | tee -a $S
wait $PS; echo "synth $(el)" | tee -a $S
python3 -c "import random; random.seed(7); print(' '.join(random.choice(['the','river','of','light','runs','under','a','stone','bridge','where','seven','birds','count','their','days']) for _ in range(1400)))" > $W/prompt.txt
for c in 512 100; do for f in 1 0; do
  h=$(TANDEM_CUDA_FUSED_QKV_STORE=$f timeout 60 $B score -m $W/q4.gguf --device cuda --prompt-file $W/prompt.txt --prefill-chunk $c --json 2>>$W/score.err | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["n_tokens"], r["logits_sha256"][:16])')
  echo "score chunk $c fused $f: $h" | tee -a $S
done; done
tail -2 $W/score.err | tee -a $S
timeout 100 $B gpu-check -m $W/q4.gguf --hash-prompt 600 --no-kernel-checks > $OUT/check-8b.md 2>$W/check.err
echo "8B end to end: exit $?, $(grep -c '| yes |' $OUT/check-8b.md) yes, $(grep -c '| NO |' $OUT/check-8b.md) NO ($(el))" | tee -a $S
grep -i "greedy\|sha256" $OUT/check-8b.md | cut -c1-230 | tee -a $S
run() { local l=$1 f=$2 tag=$3; shift 3; echo "== $l $tag $(el)" >> $R; TANDEM_CUDA_FUSED_QKV_STORE=$f timeout 120 $B bench -m $W/q4.gguf --device cuda -r 3 --output-format json "$@" 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], r["test"].replace(" ", "_") + "_" + sys.argv[2], round(r["tok_s"],1))' $l $tag | tee -a $R; }
for c in on:1 off:0 off:0 on:1; do l=${c%:*}; f=${c#*:}
  run $l $f ub512 -p 512,4096 -n 0 --ubatch 512; run $l $f ub4096 -p 4096 -n 0 --ubatch 4096; done
tail -3 $W/bench.err | tee -a $S
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3 and not line.startswith("=="):
        try: v[(f[0], f[1])].append(float(f[2]))
        except ValueError: pass
print("| 8B Q4_K_M test | fused | four launches | ratio | fused runs | four-launch runs |")
print("|---|---:|---:|---:|---|---|")
for t in sorted({k[1] for k in v}):
    n, m = v.get(("on", t), []), v.get(("off", t), [])
    if not n or not m: continue
    a, b = statistics.median(n), statistics.median(m)
    print(f"| {t} | {a:.0f} | {b:.0f} | {a/b:.3f}x | {' / '.join('%.0f' % x for x in n)} | {' / '.join('%.0f' % x for x in m)} |")
PY
echo "all done $(el)"; echo "===== summary"; cat $S
