#!/usr/bin/env bash
# Call e3: binary e2, the fused decode kernel with four (or two) query heads of a KV head a block
# over its tiles' share (`attend_rope_h<NH>_d<D>`), against e0 (main 282eedc). Kernel checks by
# default, with two blocks a row (several tiles a block in every fused case) and with two heads a
# block; gpu-check end to end; `score` hashes over 6,178 positions decoded one at a time (both modes,
# and one head a block); tg128 at depths 0, 2048, 4096, 7168 against e0 (A B B A), and at 4096 one
# and two heads a block and 16 blocks a row.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
for b in e0 e2; do gunzip -c .gpu/e/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
B=$W/bin/e2; R=$OUT/results.txt
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
for v in "" "TANDEM_CUDA_DECODE_SPLITS=2" "TANDEM_CUDA_DECODE_HEADS=2 TANDEM_CUDA_DECODE_SPLITS=3"; do
  f=$OUT/kernels${v:+-${v// /-}}.md
  env $v timeout 150 $B gpu-check > $f 2>$OUT/kernels.err; rc=$?; echo "kernel checks '$v' exit $rc $(el)"
  grep -c "| yes |" $f; grep "| NO |" $f | cut -c1-400; tail -1 $OUT/kernels.err
  [ $rc = 124 ] && { echo "hung: stop"; kill $PS; exit 1; }
done
wait $PS; echo "synth $(el)"
timeout 200 $B gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$OUT/check.err; echo "check exit $? $(el)"
grep -c "| yes |" $OUT/check.md; grep "| NO |" $OUT/check.md | cut -c1-300; grep -i "greedy\|sha256\|replay" $OUT/check.md | cut -c1-170
python3 -c "import random; random.seed(7); w=open('/usr/share/dict/words').read().split() if __import__('os').path.exists('/usr/share/dict/words') else ['alpha','river','stone','light','market','seven','quiet','paper','north','garden']; print(' '.join(random.choice(w) for _ in range(1000)))" > $W/p.txt
sc() { local l=$1 bin=$2 v=$3; shift 3; echo "score $l '$v' $*: $(env $v timeout 120 $bin score -m $W/q4.gguf --device cuda --prefill-chunk 1 --prompt-file $W/p.txt --json "$@" 2>>$W/score.err | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["n_tokens"], d["logits_sha256"][:16])')" | tee -a $R; }
sc e2 $B ""; sc e2 $B "" --deterministic; sc e2 $B TANDEM_CUDA_DECODE_HEADS=1; echo "scores $(el) (e0 in e2: 8483090ea0e118a2 both modes)"; tail -2 $W/score.err
tg() { local l=$1 d=$2 bin=$3; shift 3; echo "tg $l d$d $(env "$@" $bin bench -m $W/q4.gguf --device cuda -p 0 -n 128 -d $d -r 3 --output-format json 2>>$W/bench.err | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["tok_s"])')"; }
run() { case $1 in
    e2) tg e2 $2 $B;; e0) tg e0 $2 $W/bin/e0;;
    h1) tg h1 $2 $B TANDEM_CUDA_DECODE_HEADS=1;; h2) tg h2 $2 $B TANDEM_CUDA_DECODE_HEADS=2;;
    s16) tg s16 $2 $B TANDEM_CUDA_DECODE_SPLITS=16;;
  esac; }
for c in e2 e0 e0 e2; do run $c 0; done | tee -a $R; echo "depth 0 $(el)"
for c in e2 e0 h1 h2 s16 s16 h2 h1 e0 e2; do run $c 4096; done | tee -a $R; echo "depth 4096 $(el)"
for d in 2048 7168; do for c in e2 e0 e0 e2; do run $c $d; done | tee -a $R; echo "depth $d $(el)"; done
tail -n 2 $W/bench.err
python3 - $R <<'PY'
import statistics, sys, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "tg" and len(f) == 4: runs[(f[2], f[1])].append(float(f[3]))
med = lambda k: statistics.median(runs[k]) if runs.get(k) else float("nan")
print("| test | e2 | e0 | e2 / e0 | one head a block | two | 16 blocks a row |")
print("|---|---:|---:|---:|---:|---:|---:|")
for d in ["d0", "d2048", "d4096", "d7168"]:
    r = {c: med((d, c)) for c in ["e2", "e0", "h1", "h2", "s16"]}
    print(f"| tg128 @ {d} | {r['e2']:.1f} | {r['e0']:.1f} | {r['e2']/r['e0']:.3f} | {r['h1']:.1f} | {r['h2']:.1f} | {r['s16']:.1f} |")
PY
grep score $R
echo "all done $(el)"
