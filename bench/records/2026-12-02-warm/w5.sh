#!/usr/bin/env bash
# Call w5: binary w5 = w4 with `split_rope_kv_store` taking ROPE_HEADS heads a thread, as `rope` does
# (w4's one head a thread computed each angle's sine and cosine eight times as often, and gained
# nothing). Kernel checks; `tandem score` hashes fused on / off (chunks 512 and 100); the 8B Q4_K_M
# prefill on / off at 512-row micro-batches, on off off on.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
R=$OUT/results.txt; S=$OUT/summary.txt
gunzip -c .gpu/f/tandem-w5.gz > $W/bin/w5; chmod +x $W/bin/w5; B=$W/bin/w5
( [ -f $W/q4.gguf ] || $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
timeout 90 $B gpu-check > $OUT/kernels.md 2>$W/kernels.err
echo "kernel checks: exit $?, $(grep -c '| yes |' $OUT/kernels.md) yes, $(grep -c '| NO |' $OUT/kernels.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/kernels.md | cut -c1-300 | tee -a $S; grep -i "split + rope" $OUT/kernels.md | cut -c1-200 | tee -a $S
wait $PS; echo "synth $(el)" | tee -a $S
python3 -c "import random; random.seed(7); print(' '.join(random.choice(['the','river','of','light','runs','under','a','stone','bridge','where','seven','birds','count','their','days']) for _ in range(1400)))" > $W/prompt.txt
for c in 512 100; do for f in 1 0; do
  h=$(TANDEM_CUDA_FUSED_QKV_STORE=$f timeout 60 $B score -m $W/q4.gguf --device cuda --prompt-file $W/prompt.txt --prefill-chunk $c --json 2>>$W/score.err | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["n_tokens"], r["logits_sha256"][:16])')
  echo "score chunk $c fused $f: $h" | tee -a $S
done; done
run() { local l=$1 f=$2; echo "== $l $(el)" >> $R; TANDEM_CUDA_FUSED_QKV_STORE=$f timeout 100 $B bench -m $W/q4.gguf --device cuda -r 3 --output-format json -p 512,4096 -n 0 --ubatch 512 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], r["test"].replace(" ", "_") + "_ub512", round(r["tok_s"],1))' $l | tee -a $R; }
for c in on:1 off:0 off:0 on:1; do run ${c%:*} ${c#*:}; done
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
