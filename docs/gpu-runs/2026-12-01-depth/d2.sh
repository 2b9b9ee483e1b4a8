#!/usr/bin/env bash
# Call d2: the tile merge with its loads in flight MERGE_AHEAD tiles at a time (binary d2) against call
# d1's binary (main before it). Kernel checks; gpu-check end to end on gemma3-270m and the 8B Q4_K_M
# (hashes at the 600-token prompt as in the stage session's b1: 50463fd31f17..., e0cf7d15d85e...);
# the merge's bits at 2,000 positions (16 tiles: two rounds of loads) as `score` logits hashes, d1
# against d2, chunk 1 (every position a decode step) in both modes; then tg128 and pp512 at depth
# 4096 and 0: d2, llama.cpp, d1, d1, llama.cpp, d2.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/lcb; export TANDEM_KERNEL_CACHE=$W/k
mkdir -p $W/bin; for b in d1 d2; do gunzip -c .gpu/z/tandem-$b.gz > $W/bin/tandem-$b; chmod +x $W/bin/tandem-$b; done
B=$W/bin/tandem-d2; OLD=$W/bin/tandem-d1; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
( cat .gpu/llama-build/llama-build.tgz.part-* | tar -xzf - -C $W/lcb ) &
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 120 $B gpu-check > $OUT/kernels.md 2>$OUT/kernels.err; rc=$?; echo "kernel checks exit $rc $(el)"
grep -c "| yes |" $OUT/kernels.md; grep "| NO |" $OUT/kernels.md | cut -c1-220; tail -1 $OUT/kernels.err
[ $rc = 124 ] && { echo "hung: stop"; kill $PS; exit 1; }
wait $PS; echo "synth $(el)"
timeout 300 $B gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$OUT/check.err; echo "check exit $? $(el)"
grep -c "| yes |" $OUT/check.md; grep "| NO |" $OUT/check.md | cut -c1-300; grep -i "greedy\|sha256\|replay" $OUT/check.md | cut -c1-200
python3 -c "import random; random.seed(7); w=open('/usr/share/dict/words').read().split() if __import__('os').path.exists('/usr/share/dict/words') else ['alpha','river','stone','light','market','seven','quiet','paper','north','garden']; print(' '.join(random.choice(w) for _ in range(1000)))" > $W/p.txt
for mode in "--deterministic" ""; do for bin in $OLD $B; do
  h=$(timeout 120 $bin score -m $W/q4.gguf --device cuda $mode --prefill-chunk 1 --prompt-file $W/p.txt --json 2>>$W/score.err \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["n_tokens"], d["logits_sha256"][:16])')
  echo "score ${mode:-default} $(basename $bin): $h" | tee -a $R
done; done; echo "scores $(el)"; tail -2 $W/score.err
export LD_LIBRARY_PATH="$W/lcb${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; LB=$W/lcb/llama-bench
js() { python3 -c 'import json,sys; print(json.dumps([{"test": ("pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"]) + (" @ d%d" % r["n_depth"] if r.get("n_depth") else ""), "tok_s": r["avg_ts"]} for r in json.load(sys.stdin)]))'; }
new() { $B bench -m $W/q4.gguf --device cuda -p 512 -n 128 -d $1 -r 3 --output-format json 2>>$W/bench.err; }
old() { $OLD bench -m $W/q4.gguf --device cuda -p 512 -n 128 -d $1 -r 3 --output-format json 2>>$W/bench.err; }
llama() { $LB -m $W/q4.gguf -ngl 99 -fa 1 -p 512 -n 128 -d $1 -r 2 -o json 2>>$W/llama.err | js; }
for d in 4096 0; do
  for side in new llama old old llama new; do echo "$side d$d $($side $d)" | tee -a $R; done
  echo "depth $d $(el)"
done
tail -n 2 $W/bench.err $W/llama.err
python3 - $R <<'PY'
import json, statistics, sys, collections
runs = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    if line.startswith("score"): continue
    side, _, js = line.split(" ", 2)
    for row in json.loads(js):
        runs[row["test"]][side].append(row["tok_s"])
print("| test | d2 tok/s | d1 tok/s | llama.cpp tok/s | d2 / d1 | d2 / llama.cpp |")
print("|---|---|---|---|---:|---:|")
f = lambda xs: " / ".join(f"{x:,.1f}" for x in xs)
for test, s in runs.items():
    n, o, l = s["new"], s["old"], s["llama"]
    med = statistics.median
    print(f"| {test} | {f(n)} | {f(o)} | {f(l)} | {med(n) / med(o):.3f} | {med(n) / med(l):.2f}x |")
PY
echo "all done $(el)"
