# call d8 (H100, commit 74735ff), from the repository root with .gpu/tandem built from that commit
T=.gpu/tandem; source scripts/gpu_env.sh >/dev/null; export TANDEM_KERNEL_CACHE=/tmp/kc
$T synth --arch qwen3moe --shape qwen3-30b-a3b-4l --quant q4_k_m --seed 1 -o /tmp/q.gguf
timeout 150 $T gpu-check -m /tmp/q.gguf --prompt 600 --hash-prompt 300 > $OUT/check.md 2>$OUT/check.err
timeout 60 $T bench -m /tmp/q.gguf --device cuda -p 512 -n 128 -r 3 > $OUT/bench.md 2>&1
