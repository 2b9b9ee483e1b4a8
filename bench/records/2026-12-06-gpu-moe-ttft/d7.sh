echo "commit 87e4ae8"; T=.gpu/tandem; M=/tmp/m/q30-4l.gguf; source scripts/gpu_env.sh >/dev/null
WORK=/tmp/m LLAMA=0 RESIDENT=0 OFFLOAD=0 SLICE=qwen3-30b-a3b-4l CHECK_QUANTS=q4_k_m timeout 200 bash scripts/gpu_moe_bench.sh > $OUT/moe.log 2>&1; echo "moe rc=$?"
cp /tmp/m/check.md $OUT/ 2>/dev/null; cat /tmp/m/kernels.md /tmp/m/unit.md /tmp/m/check.err 2>/dev/null | grep -v "^test .* ok$" | tail -120 > $OUT/logs.txt
export TANDEM_KERNEL_CACHE=/tmp/m/kernels
(timeout 50 $T bench -m $M --device cuda -p 512 -n 128 -r 2; timeout 70 $T bench -m $M --device cuda --gpu-expert-budget 0 --trace -p 2048 -u 2048 -n 32 -r 2) > $OUT/bench.md 2>&1
$T synth --arch gemma3 --shape gemma3-270m --quant q4_k_m -o /tmp/g.gguf >/dev/null 2>&1; $T synth --arch llama --shape smollm2-135m --quant q4_1 -o /tmp/s.gguf >/dev/null 2>&1
timeout 245 python3 scripts/ttft_bench.py --tandem $T --device cuda --model gemma3-270m=/tmp/g.gguf --model smollm2-135m=/tmp/s.gguf --lengths 2048 8192 32768 --rates none,10gbit,1gbit --reps 2 --discard 1 --deadline 225 --log-dir /tmp/tl --out $OUT/ttft.json > $OUT/ttft.md 2>&1; echo "ttft rc=$?"; tar czf $OUT/ttft-logs.tgz -C /tmp tl 2>/dev/null
grep -E "test result|FAILED|panicked" /tmp/m/kernels.md /tmp/m/unit.md; grep -E "\| (no|NO) \||exit" /tmp/m/check.md; grep -E "tok/s|pp|tg|expert stream" $OUT/bench.md | tail -12; tail -22 $OUT/ttft.md
