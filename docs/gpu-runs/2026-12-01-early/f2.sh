#!/usr/bin/env bash
# Call f2: binary f2 = f1 + a short context's merge groups each taken whole by one block, merged in
# registers (`DecodeShare::direct` in attention.cu; up to TANDEM_CUDA_DECODE_DIRECT live tiles, default
# 2; 0: off). Kernel checks (default, direct off, one head a block); gpu-check end to end; `score`
# hashes (default, deterministic, direct up to 64 tiles: every step of the 6,178-token score merged in
# registers); tg128 on the 8B Q4_K_M with direct on / off at depths 0 (1 tile), 256 (3-4) and 512 (5-6).
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
gunzip -c .gpu/f/tandem-f2.gz > $W/bin/f2; chmod +x $W/bin/f2
B=$W/bin/f2; R=$OUT/results.txt; S=$OUT/summary.txt
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
n=0
for v in "" "TANDEM_CUDA_DECODE_DIRECT=0" "TANDEM_CUDA_DECODE_HEADS=1"; do
  n=$((n+1)); f=$OUT/kernels$n.md
  env $v timeout 150 $B gpu-check > $f 2>$W/kernels$n.err; rc=$?
  echo "kernel checks $n '$v': exit $rc, $(grep -c '| yes |' $f) yes, $(grep -c '| NO |' $f) NO ($(el))" | tee -a $S
  grep "| NO |" $f | cut -c1-400 | tee -a $S
  [ $rc = 124 ] && { echo "hung: stop"; kill $PS; exit 1; }
done
wait $PS; echo "synth $(el)"
timeout 200 $B gpu-check -m $W/g.gguf -m $W/q4.gguf --hash-prompt 600 > $OUT/check.md 2>$W/check.err
echo "end to end: exit $?, $(grep -c '| yes |' $OUT/check.md) yes ($(el))" | tee -a $S
grep "| NO |" $OUT/check.md | cut -c1-300 | tee -a $S; grep -i "sha256\|greedy" $OUT/check.md | cut -c1-150 | tee -a $S
python3 -c "import random; random.seed(7); w=open('/usr/share/dict/words').read().split() if __import__('os').path.exists('/usr/share/dict/words') else ['alpha','river','stone','light','market','seven','quiet','paper','north','garden']; print(' '.join(random.choice(w) for _ in range(1000)))" > $W/p.txt
sc() { local v=$1; shift; echo "score f2 '$v' $*: $(env $v timeout 120 $B score -m $W/q4.gguf --device cuda --prefill-chunk 1 --prompt-file $W/p.txt --json "$@" 2>>$W/score.err | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["n_tokens"], d["logits_sha256"][:16])')" | tee -a $S; }
sc ""; sc "" --deterministic; sc TANDEM_CUDA_DECODE_DIRECT=64; echo "scores (main: 8483090ea0e118a2) $(el)" | tee -a $S
tg() { local l=$1 d=$2; shift 2; echo "tg $l d$d $(env "$@" $B bench -m $W/q4.gguf --device cuda -p 0 -n 128 -d $d -r 3 --output-format json 2>>$W/bench.err | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["tok_s"])')"; }
for c in on off off on on off; do case $c in on) tg on 0 TANDEM_CUDA_DECODE_DIRECT=2;; off) tg off 0 TANDEM_CUDA_DECODE_DIRECT=0;; esac; done | tee -a $R; echo "d0 $(el)"
for c in on off off on; do case $c in on) tg on 256 TANDEM_CUDA_DECODE_DIRECT=4;; off) tg off 256 TANDEM_CUDA_DECODE_DIRECT=0;; esac; done | tee -a $R; echo "d256 $(el)"
for c in on off off on; do case $c in on) tg on 512 TANDEM_CUDA_DECODE_DIRECT=6;; off) tg off 512 TANDEM_CUDA_DECODE_DIRECT=0;; esac; done | tee -a $R; echo "d512 $(el)"
tail -n 2 $W/bench.err
python3 - $R <<'PY' | tee -a $S
import statistics, sys, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "tg" and len(f) == 4:
        try: runs[(f[2], f[1])].append(float(f[3]))
        except ValueError: pass
med = lambda k: statistics.median(runs[k]) if runs.get(k) else float("nan")
print("| test | direct | through memory | ratio | direct runs | memory runs |")
print("|---|---:|---:|---:|---|---|")
for d in ["d0", "d256", "d512"]:
    a, b = med((d, "on")), med((d, "off"))
    j = lambda k: " / ".join(f"{x:.1f}" for x in runs[(d, k)])
    print(f"| tg128 @ {d} | {a:.1f} | {b:.1f} | {a/b:.3f} | {j('on')} | {j('off')} |")
PY
echo "all done $(el)"; echo "===== summary"; cat $S
