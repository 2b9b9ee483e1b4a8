#!/usr/bin/env bash
# Call f4: binary f4 = main (f3) with the chunk kernel (`attend_tiles_body`) publishing its records as
# the decode kernel does: a barrier, then one thread's fence and counts, where every thread fenced.
# Kernel checks; gpu-check end to end (the deterministic hashes at chunks of 64 and 512 run the chunk
# kernel); `score` deterministic at 64-row chunks (the chunk kernel over 6,178 positions; must give
# main's 8483090ea0e118a2); deterministic pp512 at depths 0 and 4096, f4 f3 f3 f4.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
for b in f3 f4; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
B=$W/bin/f4; R=$OUT/results.txt; S=$OUT/summary.txt
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 150 $B gpu-check > $OUT/kernels.md 2>$W/kernels.err; rc=$?
echo "kernel checks: exit $rc, $(grep -c '| yes |' $OUT/kernels.md) yes, $(grep -c '| NO |' $OUT/kernels.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/kernels.md | cut -c1-400 | tee -a $S
[ $rc = 124 ] && { echo "hung: stop"; kill $PS; exit 1; }
wait $PS; echo "synth $(el)"
timeout 200 $B gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$W/check.err
echo "end to end: exit $?, $(grep -c '| yes |' $OUT/check.md) yes ($(el))" | tee -a $S
grep "| NO |" $OUT/check.md | cut -c1-300 | tee -a $S; grep -i "sha256\|greedy" $OUT/check.md | cut -c1-150 | tee -a $S
python3 -c "import random; random.seed(7); w=open('/usr/share/dict/words').read().split() if __import__('os').path.exists('/usr/share/dict/words') else ['alpha','river','stone','light','market','seven','quiet','paper','north','garden']; print(' '.join(random.choice(w) for _ in range(1000)))" > $W/p.txt
sc() { echo "score f4 $*: $(timeout 120 $B score -m $W/q4.gguf --device cuda --prompt-file $W/p.txt --json "$@" 2>>$W/score.err | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["n_tokens"], d["logits_sha256"][:16])')" | tee -a $S; }
sc --deterministic --prefill-chunk 64; sc --deterministic --prefill-chunk 7; echo "scores (main: 8483090ea0e118a2) $(el)" | tee -a $S
pp() { local l=$1 d=$2; echo "pp $l d$d $($W/bin/$l bench -m $W/q4.gguf --device cuda --deterministic -p 512 -n 0 -d $d -r 2 --output-format json 2>>$W/bench.err | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["tok_s"])')"; }
for d in 0 4096; do for c in f4 f3 f3 f4; do pp $c $d; done | tee -a $R; echo "d$d $(el)"; done
tail -n 2 $W/bench.err
python3 - $R <<'PY' | tee -a $S
import statistics, sys, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "pp" and len(f) == 4:
        try: runs[(f[2], f[1])].append(float(f[3]))
        except ValueError: pass
med = lambda k: statistics.median(runs[k]) if runs.get(k) else float("nan")
print("| test (deterministic) | f4 | f3 | f4 / f3 | f4 runs | f3 runs |")
print("|---|---:|---:|---:|---|---|")
for d in ["d0", "d4096"]:
    a, b = med((d, "f4")), med((d, "f3"))
    j = lambda k: " / ".join(f"{x:.1f}" for x in runs[(d, k)])
    print(f"| pp512 @ {d} | {a:.1f} | {b:.1f} | {a/b:.3f} | {j('f4')} | {j('f3')} |")
PY
echo "all done $(el)"; echo "===== summary"; cat $S
