#!/usr/bin/env bash
# Call f1: binary f1 = main (ab4e2e4) + the fused decode kernel's first tile loaded before its wait +
# gpu-check's new rows (the fused kernel, rotated, with and without QK-norm, bit for bit against
# rms_norm + rope_kv_store + the cached kernel). Against e5 (main's kernels, SASS identical). Kernel
# checks (default, two blocks a head, one head a block); gpu-check end to end; `score` hashes;
# tg128 at depths 0, 4096, 7168: f1 e5 e5 f1, and llama.cpp's llama-bench at the same depths (L f1 f1 L).
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin $W/lcb; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
for b in e5 f1; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
cat .gpu/llama-build/llama-build.tgz.part-* | tar -xzf - -C $W/lcb; export LD_LIBRARY_PATH=$W/lcb:$LD_LIBRARY_PATH
B=$W/bin/f1; R=$OUT/results.txt; S=$OUT/summary.txt
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
n=0
for v in "" "TANDEM_CUDA_DECODE_SPLITS=2" "TANDEM_CUDA_DECODE_HEADS=1"; do
  n=$((n+1)); f=$OUT/kernels$n.md
  env $v timeout 150 $B gpu-check > $f 2>$OUT/kernels$n.err; rc=$?
  echo "kernel checks $n '$v': exit $rc, $(grep -c '| yes |' $f) yes, $(grep -c '| NO |' $f) NO ($(el))" | tee -a $S
  grep "| NO |" $f | cut -c1-400 | tee -a $S
  [ $rc = 124 ] && { echo "hung: stop"; kill $PS; exit 1; }
done
grep -c "rope_kv_store then the cached kernel: true, with QK-norm (rms_norm first): true" $OUT/kernels1.md | sed 's/^/fused rows bit-equal to the chained route: /' | tee -a $S
wait $PS; echo "synth $(el)"
timeout 200 $B gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$OUT/check.err
echo "end to end: exit $?, $(grep -c '| yes |' $OUT/check.md) yes ($(el))" | tee -a $S
grep "| NO |" $OUT/check.md | cut -c1-300 | tee -a $S; grep -i "sha256\|greedy" $OUT/check.md | cut -c1-150 | tee -a $S
python3 -c "import random; random.seed(7); w=open('/usr/share/dict/words').read().split() if __import__('os').path.exists('/usr/share/dict/words') else ['alpha','river','stone','light','market','seven','quiet','paper','north','garden']; print(' '.join(random.choice(w) for _ in range(1000)))" > $W/p.txt
sc() { local v=$1; shift; echo "score f1 '$v' $*: $(env $v timeout 120 $B score -m $W/q4.gguf --device cuda --prefill-chunk 1 --prompt-file $W/p.txt --json "$@" 2>>$W/score.err | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["n_tokens"], d["logits_sha256"][:16])')" | tee -a $S; }
sc ""; sc "" --deterministic; sc TANDEM_CUDA_DECODE_HEADS=1; echo "scores (main: 8483090ea0e118a2) $(el)" | tee -a $S
tg() { local l=$1 d=$2 bin=$3; echo "tg $l d$d $($bin bench -m $W/q4.gguf --device cuda -p 0 -n 128 -d $d -r 3 --output-format json 2>>$W/bench.err | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["tok_s"])')"; }
lt() { local d=$1; echo "tg llama d$d $($W/lcb/llama-bench -m $W/q4.gguf -ngl 99 -fa 1 -p 0 -n 128 -d $d -r 2 -o json 2>>$W/llama.err | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])')"; }
run() { case $1 in f1) tg f1 $2 $B;; e5) tg e5 $2 $W/bin/e5;; L) lt $2;; esac; }
for d in 0 4096 7168; do for c in f1 e5 e5 f1 L f1 f1 L; do run $c $d; done | tee -a $R; echo "depth $d $(el)"; done
tail -n 2 $W/bench.err $W/llama.err
python3 - $R <<'PY' | tee -a $S
import statistics, sys, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "tg" and len(f) == 4:
        try: runs[(f[2], f[1])].append(float(f[3]))
        except ValueError: pass
med = lambda k: statistics.median(runs[k]) if runs.get(k) else float("nan")
print("| test | f1 | e5 | llama.cpp | f1 / e5 | f1 / llama.cpp | f1 runs | e5 runs | llama.cpp runs |")
print("|---|---:|---:|---:|---:|---:|---|---|---|")
for d in ["d0", "d4096", "d7168"]:
    a, b, c = med((d, "f1")), med((d, "e5")), med((d, "llama"))
    j = lambda k: " / ".join(f"{x:.1f}" for x in runs[(d, k)])
    print(f"| tg128 @ {d} | {a:.1f} | {b:.1f} | {c:.1f} | {a/b:.3f} | {a/c:.2f}x | {j('f1')} | {j('e5')} | {j('llama')} |")
PY
echo "all done $(el)"; echo "===== summary"; cat $S
