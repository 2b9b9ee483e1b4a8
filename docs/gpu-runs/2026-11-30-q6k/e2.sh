#!/usr/bin/env bash
# Call e2: where a replayed decode step's time goes, kernel by kernel (Nsight Systems, graph nodes traced).
source scripts/gpu_env.sh >/dev/null; W=/tmp/t; mkdir -p $W; export TANDEM_KERNEL_CACHE=$W/k
N=.gpu/tandem-e1
NSYS=$(ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
[ -z "$NSYS" ] && NSYS=$(which nsys)
echo "nsys: $NSYS"; ls /usr/local/cuda/ | tr '\n' ' '; echo
$N synth --arch llama --shape llama3-8b --quant q4_k_m --seed 1 -o $W/q4.gguf 2>&1 | tail -1
( $N synth --arch llama --shape llama3-8b --quant q8_0 --seed 1 -o $W/q8.gguf 2>&1 | tail -1 ) &
for f in q4; do
  TANDEM_CUDA_PREFETCH_MB=0 timeout 200 $NSYS profile --cuda-graph-trace=node -t cuda -o $W/tl-$f -f true \
    $N bench -m $W/$f.gguf --device cuda -p 0 -n 32 -r 1 > $OUT/nsys-$f.log 2>&1; echo "nsys $f exit $?"
  timeout 120 $NSYS stats -r cuda_gpu_trace -f csv -o $W/trace-$f $W/tl-$f.nsys-rep > /dev/null 2>&1; echo "stats exit $?"
  ls $W/ | tr '\n' ' '; echo
  gzip -c $W/trace-$f*cuda_gpu_trace.csv > $OUT/trace-$f.csv.gz
done
wait
for f in q8; do
  TANDEM_CUDA_PREFETCH_MB=0 timeout 200 $NSYS profile --cuda-graph-trace=node -t cuda -o $W/tl-$f -f true \
    $N bench -m $W/$f.gguf --device cuda -p 0 -n 32 -r 1 > $OUT/nsys-$f.log 2>&1; echo "nsys $f exit $?"
  timeout 120 $NSYS stats -r cuda_gpu_trace -f csv -o $W/trace-$f $W/tl-$f.nsys-rep > /dev/null 2>&1; echo "stats exit $?"
  gzip -c $W/trace-$f*cuda_gpu_trace.csv > $OUT/trace-$f.csv.gz
done
ls -la $OUT; tail -5 $OUT/nsys-q4.log
