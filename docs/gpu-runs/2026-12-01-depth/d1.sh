#!/usr/bin/env bash
# Call d1: decode and prefill deep into the context on the H200, Tandem against llama.cpp, the 8B
# Q4_K_M. `tandem bench --depth 4096` and `llama-bench -d 4096` start each test after 4,096 tokens
# already in the context (prefilled untimed); depth 0 in the same call for reference. A B B A:
# Tandem, llama.cpp, llama.cpp, Tandem. llama-bench unpacked from the flash session's build.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/lcb; export TANDEM_KERNEL_CACHE=$W/k
B=.gpu/s/tandem-d1; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
( cat .gpu/llama-build/llama-build.tgz.part-* | tar -xzf - -C $W/lcb ) & PL=$!
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
wait $PL; echo "synth and unpack $(el)"
export LD_LIBRARY_PATH="$W/lcb${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; LB=$W/lcb/llama-bench
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
tandem() { $B bench -m $W/q4.gguf --device cuda -p 512 -n 128 -d $1 -r 3 --output-format json 2>>$W/bench.err; }
llama() { $LB -m $W/q4.gguf -ngl 99 -fa 1 -p 512 -n 128 -d $1 -r 2 -o json 2>>$W/llama.err \
  | python3 -c 'import json,sys; print(json.dumps([{"test": ("pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"]) + (" @ d%d" % r["n_depth"] if r.get("n_depth") else ""), "tok_s": r["avg_ts"]} for r in json.load(sys.stdin)]))'; }
for d in 4096 0; do
  for side in tandem llama llama tandem; do echo "$side d$d $($side $d)" | tee -a $R; done
  echo "depth $d $(el)"
done
tail -3 $W/bench.err $W/llama.err
python3 - $R <<'PY'
import json, statistics, sys, collections
runs = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    side, _, js = line.split(" ", 2)
    for row in json.loads(js):
        runs[row["test"]][side].append(row["tok_s"])
print("| test | Tandem tok/s | llama.cpp tok/s | ratio of medians |")
print("|---|---|---|---:|")
for test, sides in runs.items():
    t, l = sides["tandem"], sides["llama"]
    print(f"| {test} | {' / '.join(f'{x:,.1f}' for x in t)} | {' / '.join(f'{x:,.1f}' for x in l)} | "
          f"{statistics.median(t) / statistics.median(l):.2f}x |")
PY
echo "all done $(el)"
