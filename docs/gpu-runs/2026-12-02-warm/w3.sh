#!/usr/bin/env bash
# Call w3: whether a server's first decode steps at a batch size cost more than later ones, and
# whether warming up decode batches helps. Binary w1 (warm-up: chunks of 1, 64 and 512 rows) against
# w3 (also one decode step at 2-8, 16, 32 and 64 sequences), w1 w3 w3 w1: `tandem serve --device
# cuda` on the 8B Q4_K_M (--ctx 512), `scripts/batch_gaps.py`: groups of 4, 12, 24 and 48 streams
# (sizes the warm-up does not step through), twice each; the largest gap between a stream's tokens.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
S=$OUT/summary.txt
for b in w1 w3; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
[ -f $W/q4.gguf ] || $W/bin/w3 synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
echo "synth $(el)" | tee -a $S
port=8090
for b in w1 w3 w3 w1; do
  port=$((port + 1))
  $W/bin/$b serve -m $W/q4.gguf --device cuda --port $port --ctx 512 --kv-budget 8G -v 2>$W/serve-$b-$port.err >/dev/null & SP=$!
  for _ in $(seq 1 300); do python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=1)" http://127.0.0.1:$port/health 2>/dev/null && break; sleep 0.1; done
  grep -i "warm-up" $W/serve-$b-$port.err | tee -a $S
  timeout 100 python3 scripts/batch_gaps.py --port $port --groups 4,12,24,48 --passes 2 --tokens 24 --words 20 --label $b | tee -a $OUT/gaps.jsonl
  kill $SP; wait $SP
  echo "$b done $(el)" | tee -a $S
done
python3 - $OUT/gaps.jsonl <<'PY' | tee -a $S
import json, sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line); v[(r["label"], r["pass"], r["streams"])].append(r)
print("| binary | streams | pass 1 max gap ms | pass 2 max gap ms | pass 1 median gap | pass 2 median gap | pass 1 max TTFT | pass 2 max TTFT |")
print("|---|---:|---|---|---|---|---|---|")
for b in ("w1", "w3"):
    for n in (4, 12, 24, 48):
        f = lambda p, k: " / ".join(str(r[k]) for r in v[(b, p, n)])
        print(f"| {b} | {n} | {f(1,'max_gap_ms')} | {f(2,'max_gap_ms')} | {f(1,'median_gap_ms')} | {f(2,'median_gap_ms')} | {f(1,'max_ttft_ms')} | {f(2,'max_ttft_ms')} |")
PY
echo "all done $(el)"; echo "===== summary"; cat $S
