#!/usr/bin/env bash
# Call e5: binary e5 (landed) = e4 with the two-heads form taken only once the live tiles outnumber
# the blocks a head (`attend_decode`: a block a head in a short context), four heads dropped. Against
# e0 (main 282eedc). Kernel checks (default, two blocks a head, one head a block); gpu-check end to
# end; `score` hashes (default, deterministic, one head a block); tg128 at depths 0, 2048, 4096, 7168
# (A B B A); Nsight Compute on the fused kernel at depth 4096.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
for b in e0 e5; do gunzip -c .gpu/e/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
B=$W/bin/e5; R=$OUT/results.txt; S=$OUT/summary.txt
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
n=0
for v in "" "TANDEM_CUDA_DECODE_SPLITS=2" "TANDEM_CUDA_DECODE_HEADS=1"; do
  n=$((n+1)); f=$OUT/kernels$n.md
  env $v timeout 150 $B gpu-check > $f 2>$OUT/kernels$n.err; rc=$?
  echo "kernel checks $n '$v': exit $rc, $(grep -c '| yes |' $f) yes, $(grep -c '| NO |' $f) NO ($(el))" | tee -a $S
  grep "| NO |" $f | cut -c1-300 | tee -a $S
  [ $rc = 124 ] && { echo "hung: stop"; kill $PS; exit 1; }
done
wait $PS; echo "synth $(el)"
timeout 200 $B gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$OUT/check.err
echo "end to end: exit $?, $(grep -c '| yes |' $OUT/check.md) yes ($(el))" | tee -a $S
grep "| NO |" $OUT/check.md | cut -c1-300 | tee -a $S; grep -i "sha256\|greedy" $OUT/check.md | cut -c1-150 | tee -a $S
python3 -c "import random; random.seed(7); w=open('/usr/share/dict/words').read().split() if __import__('os').path.exists('/usr/share/dict/words') else ['alpha','river','stone','light','market','seven','quiet','paper','north','garden']; print(' '.join(random.choice(w) for _ in range(1000)))" > $W/p.txt
sc() { local v=$1; shift; echo "score e5 '$v' $*: $(env $v timeout 120 $B score -m $W/q4.gguf --device cuda --prefill-chunk 1 --prompt-file $W/p.txt --json "$@" 2>>$W/score.err | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["n_tokens"], d["logits_sha256"][:16])')" | tee -a $S; }
sc ""; sc "" --deterministic; sc TANDEM_CUDA_DECODE_HEADS=1; echo "scores (main: 8483090ea0e118a2) $(el)" | tee -a $S
tg() { local l=$1 d=$2 bin=$3; shift 3; echo "tg $l d$d $(env "$@" $bin bench -m $W/q4.gguf --device cuda -p 0 -n 128 -d $d -r 3 --output-format json 2>>$W/bench.err | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["tok_s"])')"; }
run() { case $1 in e5) tg e5 $2 $B;; e0) tg e0 $2 $W/bin/e0;; esac; }
for c in e5 e0 e0 e5 e5 e0; do run $c 0; done | tee -a $R; echo "depth 0 $(el)"
for d in 2048 4096 7168; do for c in e5 e0 e0 e5; do run $c $d; done | tee -a $R; echo "depth $d $(el)"; done
tail -n 2 $W/bench.err
python3 - $R <<'PY' | tee -a $S
import statistics, sys, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "tg" and len(f) == 4: runs[(f[2], f[1])].append(float(f[3]))
med = lambda k: statistics.median(runs[k]) if runs.get(k) else float("nan")
print("| test | e5 | e0 | e5 / e0 | e5 runs | e0 runs |")
print("|---|---:|---:|---:|---|---|")
for d in ["d0", "d2048", "d4096", "d7168"]:
    a, b = med((d, "e5")), med((d, "e0"))
    print(f"| tg128 @ {d} | {a:.1f} | {b:.1f} | {a/b:.3f} | {' / '.join(f'{x:.1f}' for x in runs[(d,'e5')])} | {' / '.join(f'{x:.1f}' for x in runs[(d,'e0')])} |")
PY
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
timeout 90 $NCU --clock-control none -k "regex:attend_rope" --launch-skip 200 --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats --print-details all \
  $B bench -m $W/q4.gguf --device cuda -p 0 -n 16 -d 4096 -r 1 > $OUT/ncu-d4096.txt 2>&1; echo "ncu exit $? $(el)"
grep -E "attend_rope|Duration|Elapsed Cycles|SM Active Cycles|Registers Per|Grid Size|Waves Per SM|Achieved Occupancy|Warp Cycles Per Issued|Issued Warp Per Scheduler|Stall (Barrier|Long|Wait|Short|Membar)" $OUT/ncu-d4096.txt | head -16 | tee -a $S
echo "all done $(el)"; echo "===== summary"; cat $S
