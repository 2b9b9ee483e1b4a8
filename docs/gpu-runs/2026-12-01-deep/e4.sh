#!/usr/bin/env bash
# Call e4: binary e4 = e2 with RoPE's rotation and the tile merge's sums written out as fused
# multiply-adds (the form the compiler had chosen; e3's one-head-a-block hashes moved where it chose
# the other), the merge's chunks shared among all warps, two heads a block by default. Against e0
# (main 282eedc). Kernel checks in four configurations; gpu-check end to end; `score` hashes (6,178
# positions decoded one at a time) by default, deterministic, one and four heads a block; tg128 at
# depths 0, 2048, 4096, 7168 for e4 against e0 (A B B A), and at 0 and 4096 one and four heads.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
for b in e0 e4; do gunzip -c .gpu/e/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
B=$W/bin/e4; R=$OUT/results.txt; S=$OUT/summary.txt
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
n=0
for v in "" "TANDEM_CUDA_DECODE_HEADS=1 TANDEM_CUDA_DECODE_SPLITS=2" "TANDEM_CUDA_DECODE_HEADS=4 TANDEM_CUDA_DECODE_SPLITS=3" "TANDEM_CUDA_DECODE_HEADS=1"; do
  n=$((n+1)); f=$OUT/kernels$n.md
  env $v timeout 150 $B gpu-check > $f 2>$OUT/kernels$n.err; rc=$?
  echo "kernel checks $n '$v': exit $rc, $(grep -c '| yes |' $f) yes, $(grep -c '| NO |' $f) NO ($(el))" | tee -a $S
  grep "| NO |" $f | cut -c1-300 | tee -a $S
  [ $rc = 124 ] && { echo "hung: stop"; kill $PS; exit 1; }
done
wait $PS; echo "synth $(el)"
timeout 200 $B gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$OUT/check.err
echo "end to end: exit $?, $(grep -c '| yes |' $OUT/check.md) yes ($(el))" | tee -a $S
grep "| NO |" $OUT/check.md | cut -c1-300 | tee -a $S; grep -i "sha256" $OUT/check.md | cut -c1-150 | tee -a $S
python3 -c "import random; random.seed(7); w=open('/usr/share/dict/words').read().split() if __import__('os').path.exists('/usr/share/dict/words') else ['alpha','river','stone','light','market','seven','quiet','paper','north','garden']; print(' '.join(random.choice(w) for _ in range(1000)))" > $W/p.txt
sc() { local v=$1; shift; echo "score e4 '$v' $*: $(env $v timeout 120 $B score -m $W/q4.gguf --device cuda --prefill-chunk 1 --prompt-file $W/p.txt --json "$@" 2>>$W/score.err | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["n_tokens"], d["logits_sha256"][:16])')" | tee -a $S; }
sc ""; sc "" --deterministic; sc TANDEM_CUDA_DECODE_HEADS=1; sc TANDEM_CUDA_DECODE_HEADS=4; echo "scores (main: 8483090ea0e118a2) $(el)" | tee -a $S; tail -2 $W/score.err
tg() { local l=$1 d=$2 bin=$3; shift 3; echo "tg $l d$d $(env "$@" $bin bench -m $W/q4.gguf --device cuda -p 0 -n 128 -d $d -r 3 --output-format json 2>>$W/bench.err | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["tok_s"])')"; }
run() { case $1 in
    e4) tg e4 $2 $B;; e0) tg e0 $2 $W/bin/e0;;
    h1) tg h1 $2 $B TANDEM_CUDA_DECODE_HEADS=1;; h4) tg h4 $2 $B TANDEM_CUDA_DECODE_HEADS=4;;
  esac; }
for d in 0 4096; do for c in e4 e0 h1 h4 h4 h1 e0 e4; do run $c $d; done | tee -a $R; echo "depth $d $(el)"; done
for d in 2048 7168; do for c in e4 e0 e0 e4; do run $c $d; done | tee -a $R; echo "depth $d $(el)"; done
tail -n 2 $W/bench.err
python3 - $R <<'PY' | tee -a $S
import statistics, sys, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "tg" and len(f) == 4: runs[(f[2], f[1])].append(float(f[3]))
med = lambda k: statistics.median(runs[k]) if runs.get(k) else float("nan")
print("| test | e4 (two heads a block) | e0 | e4 / e0 | one head | four heads |")
print("|---|---:|---:|---:|---:|---:|")
for d in ["d0", "d2048", "d4096", "d7168"]:
    r = {c: med((d, c)) for c in ["e4", "e0", "h1", "h4"]}
    print(f"| tg128 @ {d} | {r['e4']:.1f} | {r['e0']:.1f} | {r['e4']/r['e0']:.3f} | {r['h1']:.1f} | {r['h4']:.1f} |")
PY
echo "all done $(el)"; echo "===== summary"; cat $S
