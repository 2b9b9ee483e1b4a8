#!/usr/bin/env bash
# Call e1: the prefill GEMM shapes through cublasGemmEx and every cuBLASLt heuristic algorithm (no model).
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 scripts/gemm_algos.py --reps 15 > $OUT/gemm.md 2> $OUT/gemm.err; echo rc $?; tail -5 $OUT/gemm.err; cat $OUT/gemm.md
