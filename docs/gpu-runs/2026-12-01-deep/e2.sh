#!/usr/bin/env bash
# Call e2: the fused decode kernel with several tiles a block (binary e1; e1x the same with
# TANDEM_CUDA_DECODE_EARLY=1 issuing the first tile's loads before the wait), against e0 (main
# 282eedc). Kernel checks (two new fused cases deep enough for several tiles a block); gpu-check end to
# end; `score` hashes over 6,178 positions decoded one at a time, both modes, e1 against e0; tg128
# at depths 0, 2048, 4096, 7168, e1 against e0 (A B B A), and at 4096 the blocks per head (4, 16) and
# the early loads.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
for b in e0 e1 e1x; do gunzip -c .gpu/e/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
B=$W/bin/e1; R=$OUT/results.txt
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 150 $B gpu-check > $OUT/kernels.md 2>$OUT/kernels.err; rc=$?; echo "kernel checks exit $rc $(el)"
grep -c "| yes |" $OUT/kernels.md; grep "| NO |" $OUT/kernels.md | cut -c1-400; grep "fused RoPE" $OUT/kernels.md | cut -c1-120; tail -1 $OUT/kernels.err
[ $rc = 124 ] && { echo "hung: stop"; kill $PS; exit 1; }
wait $PS; echo "synth $(el)"
timeout 200 $B gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$OUT/check.err; echo "check exit $? $(el)"
grep -c "| yes |" $OUT/check.md; grep "| NO |" $OUT/check.md | cut -c1-300; grep -i "greedy\|sha256\|replay" $OUT/check.md | cut -c1-170
python3 -c "import random; random.seed(7); w=open('/usr/share/dict/words').read().split() if __import__('os').path.exists('/usr/share/dict/words') else ['alpha','river','stone','light','market','seven','quiet','paper','north','garden']; print(' '.join(random.choice(w) for _ in range(1000)))" > $W/p.txt
sc() { local l=$1 bin=$2; shift 2; echo "score $l $*: $(timeout 120 $bin score -m $W/q4.gguf --device cuda --prefill-chunk 1 --prompt-file $W/p.txt --json "$@" 2>>$W/score.err | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["n_tokens"], d["logits_sha256"][:16])')" | tee -a $R; }
sc e0 $W/bin/e0; sc e1 $B; sc e0 $W/bin/e0 --deterministic; sc e1 $B --deterministic; echo "scores $(el)"; tail -2 $W/score.err
tg() { local l=$1 d=$2 bin=$3; shift 3; echo "tg $l d$d $(env "$@" $bin bench -m $W/q4.gguf --device cuda -p 0 -n 128 -d $d -r 3 --output-format json 2>>$W/bench.err | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["tok_s"])')"; }
run() { case $1 in
    e1) tg e1 $2 $B;; e0) tg e0 $2 $W/bin/e0;;
    s4) tg s4 $2 $B TANDEM_CUDA_DECODE_SPLITS=4;; s16) tg s16 $2 $B TANDEM_CUDA_DECODE_SPLITS=16;;
    x0) tg x0 $2 $W/bin/e1x TANDEM_CUDA_DECODE_EARLY=0;; x1) tg x1 $2 $W/bin/e1x TANDEM_CUDA_DECODE_EARLY=1;;
  esac; }
for c in e1 e0 e0 e1; do run $c 0; done | tee -a $R; echo "depth 0 $(el)"
for c in e1 e0 s4 s16 x1 x0 x0 x1 s16 s4 e0 e1; do run $c 4096; done | tee -a $R; echo "depth 4096 $(el)"
for d in 2048 7168; do for c in e1 e0 e0 e1; do run $c $d; done | tee -a $R; echo "depth $d $(el)"; done
tail -n 2 $W/bench.err
python3 - $R <<'PY'
import statistics, sys, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "tg" and len(f) == 4: runs[(f[2], f[1])].append(float(f[3]))
med = lambda k: statistics.median(runs[k]) if runs.get(k) else float("nan")
print("| test | e1 | e0 | e1 / e0 | s4 | s16 | early x1 | x0 |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for d in ["d0", "d2048", "d4096", "d7168"]:
    r = {c: med((d, c)) for c in ["e1", "e0", "s4", "s16", "x1", "x0"]}
    print(f"| tg128 @ {d} | {r['e1']:.1f} | {r['e0']:.1f} | {r['e1']/r['e0']:.3f} | {r['s4']:.1f} | {r['s16']:.1f} | {r['x1']:.1f} | {r['x0']:.1f} |")
PY
grep score $R
echo "all done $(el)"
