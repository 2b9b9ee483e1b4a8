#!/usr/bin/env bash
# Call d5: binary d5, as d4 but the fused decode kernel counts and merges as a block of one head
# always did (its own branch; d4's shared loop cost 2.6% at depth 4096). Kernel checks; gpu-check end
# to end by default and with grouping forced for chunks; the `score` hash (d2: 8483090ea0e118a2);
# tg128 at depths 0 and 4096 against d2; deterministic pp512 at depth 4096, grouped against never.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/lcb; export TANDEM_KERNEL_CACHE=$W/k
mkdir -p $W/bin; for b in d2 d5; do gunzip -c .gpu/z/tandem-$b.gz > $W/bin/tandem-$b; chmod +x $W/bin/tandem-$b; done
B=$W/bin/tandem-d5; OLD=$W/bin/tandem-d2; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 120 $B gpu-check > $OUT/kernels.md 2>$OUT/kernels.err; rc=$?; echo "kernel checks exit $rc $(el)"
grep -c "| yes |" $OUT/kernels.md; grep "| NO |" $OUT/kernels.md | cut -c1-300; grep -c "per KV head bit-equal: true" $OUT/kernels.md; tail -1 $OUT/kernels.err
[ $rc = 124 ] && { echo "hung: stop"; kill $PS; exit 1; }
wait $PS; echo "synth $(el)"
for g in "" 1; do
  TANDEM_CUDA_GROUP_TILES=$g timeout 200 $B gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check$g.md 2>$OUT/check$g.err; echo "check (group tiles '${g:-default}') exit $? $(el)"
  grep -c "| yes |" $OUT/check$g.md; grep "| NO |" $OUT/check$g.md | cut -c1-300; grep -i "greedy\|sha256\|replay" $OUT/check$g.md | cut -c1-170
done
python3 -c "import random; random.seed(7); w=open('/usr/share/dict/words').read().split() if __import__('os').path.exists('/usr/share/dict/words') else ['alpha','river','stone','light','market','seven','quiet','paper','north','garden']; print(' '.join(random.choice(w) for _ in range(1000)))" > $W/p.txt
sc() { local l=$1 bin=$2; shift 2; echo "score $l: $(env "$@" timeout 120 $bin score -m $W/q4.gguf --device cuda --prefill-chunk 1 --prompt-file $W/p.txt --json 2>>$W/score.err | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["n_tokens"], d["logits_sha256"][:16])')" | tee -a $R; }
sc d5 $B; echo "scores $(el)"; tail -2 $W/score.err
export LD_LIBRARY_PATH="$W/lcb${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; LB=$W/lcb/llama-bench
tg() { local l=$1 d=$2 bin=$3; shift 3; echo "tg $l d$d $(env "$@" $bin bench -m $W/q4.gguf --device cuda -p 0 -n 128 -d $d -r 3 --output-format json 2>>$W/bench.err | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["tok_s"])')"; }
run() { case $1 in
    d5) tg d5 $2 $B;; forced) tg forced $2 $B TANDEM_CUDA_GROUP_TILES=1;; never) tg never $2 $B TANDEM_CUDA_GROUP_TILES=1000000;;
    d2) tg d2 $2 $OLD;;
    llama) echo "tg llama d$2 $($LB -m $W/q4.gguf -ngl 99 -fa 1 -p 0 -n 128 -d $2 -r 2 -o json 2>>$W/llama.err | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])')";;
  esac; }
for d in 0 4096; do
  for c in d5 d2 d2 d5 d5 d2; do run $c $d; done | tee -a $R
  echo "depth $d $(el)"
done
dp() { echo "det-pp $1 $(env "$2" $B bench -m $W/q4.gguf --device cuda --deterministic -p 512 -n 0 -d 4096 -r 2 --output-format json 2>>$W/bench.err | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["tok_s"])')"; }
for c in d5 never; do case $c in d5) dp d5 X=1;; never) dp never TANDEM_CUDA_GROUP_TILES=1000000;; esac; done | tee -a $R
echo "det $(el)"; tail -n 2 $W/bench.err $W/llama.err
python3 - $R <<'PY'
import statistics, sys, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "tg" and len(f) == 4: runs[(f[2], f[1])].append(float(f[3]))
    if f[0] == "det-pp" and len(f) == 3: runs[("det pp512 @ d4096", f[1])].append(float(f[2]))
med = lambda k: statistics.median(runs[k]) if runs.get(k) else float("nan")
print("| test | d5 | d2 | d5 / d2 |")
print("|---|---:|---:|---:|")
for d in ["d0", "d4096"]:
    r = {c: med((d, c)) for c in ["d5", "d2"]}
    print(f"| tg128 @ {d} | {r['d5']:.1f} | {r['d2']:.1f} | {r['d5']/r['d2']:.3f} |")
print(f"| det pp512 @ d4096 | {med(('det pp512 @ d4096','d5')):.1f} | {med(('det pp512 @ d4096','never')):.1f} (d5 never grouping) | - |")
PY
echo "all done $(el)"
