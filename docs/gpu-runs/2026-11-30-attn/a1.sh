#!/usr/bin/env bash
# Call a1: where attend_tiles (and add_norm_to, rope_kv_store) spend their time: Nsight Compute's
# full set with per-instruction stall samples (SASS source page), at boost clocks, on a decode step
# of the 8B Q4_K_M at position ~50 (binary s0 = 49627fd).
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-s0; NCU=/usr/local/cuda/bin/ncu
s=$(date +%s); $N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1; echo "synth 8b q4 $(( $(date +%s)-s )) s"
prof() { timeout 200 $NCU -k "regex:^$1\$" --launch-skip $2 --launch-count 1 --set full --clock-control none --import-source no -o $W/$1 -f $N bench -m $W/q4.gguf --device cuda -p 0 -n 64 -r 1 > $W/$1.log 2>&1; echo "ncu $1 exit $? $(date +%T)"
  $NCU -i $W/$1.ncu-rep --page details --print-details all > $OUT/$1-details.txt 2>&1
  $NCU -i $W/$1.ncu-rep --page source --csv --print-source sass > $W/$1-sass.csv 2>&1
  python3 docs/gpu-runs/2026-11-30-attn/stalls.py $W/$1-sass.csv > $OUT/$1-stalls.txt 2>&1; }
prof attend_tiles 1600
prof add_norm_to 3200
prof rope_kv_store 1600
for k in attend_tiles add_norm_to rope_kv_store; do echo "== $k"; grep -E "^ +(Duration|Elapsed Cycles|SM Active Cycles|SM Frequency|Registers Per|Warp Cycles Per Issued|Executed Ipc A)" $OUT/$k-details.txt | head -8; head -30 $OUT/$k-stalls.txt | cut -c1-150; done
