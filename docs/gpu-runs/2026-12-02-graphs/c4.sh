#!/usr/bin/env bash
# Call c4: binary c4 = c3's + graphs evicted least recently replayed first (a server's batch sizes
# come and go) and the graph key's span shape as a struct; prev = a0af245. gpu-check end to end on
# gemma3-270m (short prompt); then `tandem serve --device cuda` on gemma3-270m driven by `tandem
# bench serve --clients 16` for 10 s, c4, prev, prev, c4.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
S=$OUT/summary.txt
for b in c4 prev; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done
$W/bin/c4 synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
G=$W/g.gguf
timeout 100 $W/bin/c4 gpu-check -m $G --prompt 400 --gen 24 --hash-prompt 200 > $OUT/check.md 2>$W/check.err
echo "end to end: exit $?, $(grep -c '| yes |' $OUT/check.md) yes, $(grep -c '| NO |' $OUT/check.md) NO ($(el))" | tee -a $S
grep -i "NO |\|together\|replay" $OUT/check.md | cut -c1-200 | tee -a $S; tail -2 $W/check.err | tee -a $S
wait_up() { for i in $(seq 1 60); do curl -sf -m 2 http://127.0.0.1:18181/health >/dev/null 2>&1 && return 0; sleep 0.5; done; return 1; }
bench() { $W/bin/$1 serve -m $G --device cuda --port 18181 --ctx 2048 --max-queue 256 > $W/srv-$1.log 2>&1 & local pid=$!
  if wait_up; then echo "== $1 ($(el))" | tee -a $S
    timeout 30 $W/bin/c4 bench serve --addr 127.0.0.1:18181 --clients 16 --duration 10 --long-every 1000 2>&1 | grep -E "^\||tokens/s|rror" | tee -a $S
  else echo "$1 did not come up" | tee -a $S; tail -5 $W/srv-$1.log | tee -a $S; fi
  kill $pid; wait $pid 2>/dev/null; sleep 1; }
bench c4; bench prev; bench prev; bench c4
echo "all done $(el)"
