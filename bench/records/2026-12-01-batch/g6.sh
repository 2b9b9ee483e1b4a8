#!/usr/bin/env bash
# Call g6: serving over HTTP on the 8B Q4_K_M, `tandem serve --device cuda` (binary g5) against
# llama.cpp's `llama-server -ngl 99 -fa on`, both driven by `tandem bench serve` (streaming
# /v1/completions): 32 clients streaming 64-token completions back to back while a ~1,700-token prompt
# arrives every 5 s, 20 s a run; then the same with no long prompts. Tandem, llama.cpp, llama.cpp, Tandem.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin $W/lcb; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
S=$OUT/summary.txt
gunzip -c .gpu/f/tandem-g5.gz > $W/bin/g5; chmod +x $W/bin/g5; B=$W/bin/g5
cat .gpu/llama-build/llama-build.tgz.part-* | tar -xzf - -C $W/lcb; export LD_LIBRARY_PATH=$W/lcb:$LD_LIBRARY_PATH
$B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth $(el)" | tee -a $S
M=$W/q4.gguf; CL=32
wait_up() { for i in $(seq 1 120); do curl -sf -m 2 http://127.0.0.1:$1/health >/dev/null 2>&1 && return 0; sleep 1; done; return 1; }
server() { case $1 in
  tandem) $B serve -m $M --device cuda --port 18181 --ctx 2048 --kv-budget 24G --max-queue 256 > $W/srv-$1.log 2>&1 & ;;
  llama) $W/lcb/llama-server -m $M -ngl 99 -fa on -np $CL -c $((CL*2048)) --port 18181 > $W/srv-$1.log 2>&1 & ;;
  esac; echo $!; }
bench() { local who=$1 every=$2; local pid=$(server $who)
  if wait_up 18181; then
    echo "== $who, long prompt every $every s ($(el))" | tee -a $S
    timeout 60 $B bench serve --addr 127.0.0.1:18181 --clients $CL --duration 20 --long-every $every 2>&1 | grep -E "^\||tokens/s|rror" | tee -a $S
  else echo "$who did not come up"; tail -5 $W/srv-$who.log; fi
  kill $pid; wait $pid 2>/dev/null; sleep 2; }
bench tandem 5; bench llama 5; bench llama 1000; bench tandem 1000
echo "all done $(el)"; echo "===== summary"; cat $S
