#!/usr/bin/env python3
"""Times the prefill GEMM shapes on the GPU machine: cublasGemmEx's default choice (what Tandem calls
today) against every algorithm cuBLASLt's heuristic offers for the same product, so that a load-time
choice per shape can be judged before it is built. Needs PyTorch (memory, events) and the cuBLAS
libraries beside it; no model.

  python3 scripts/gemm_algos.py [--shapes 8b,27b] [--rows 512,4096] [--algos 24]

The product is Tandem's: C (rows x t, column-major, f32 or f16) = W^T X, W stored row-major as
[rows][cols] f16, X as [t][cols] f16, f32 accumulation.
"""
import argparse
import ctypes
import glob
import os
import statistics
import sys

import torch

SHAPES = {
    # name: (rows, cols, out dtype, ldc or None)
    "8b": [
        ("q/o", 4096, 4096, "f32"),
        ("k/v", 1024, 4096, "f32"),
        ("qkv", 6144, 4096, "f32"),
        ("gate|up", 28672, 4096, "f16"),
        ("down", 4096, 14336, "f32"),
    ],
    "27b": [
        ("q", 4096, 5376, "f32"),
        ("k/v", 2048, 5376, "f32"),
        ("o", 5376, 4096, "f32"),
        ("gate|up", 43008, 5376, "f16"),
        ("down", 5376, 21504, "f32"),
    ],
}

R_16F, R_32F, COMPUTE_32F, OP_N, OP_T = 2, 0, 68, 0, 1
DESC_TRANSA, DESC_TRANSB, PREF_MAX_WORKSPACE = 3, 4, 1


class Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class Heuristic(ctypes.Structure):
    _fields_ = [
        ("algo", Algo),
        ("workspace", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("waves", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


def load(name):
    roots = [os.path.dirname(torch.__file__) + "/..", "/usr/local/cuda", "/usr/lib/x86_64-linux-gnu", "/opt"]
    for root in roots:
        hits = sorted(glob.glob(f"{root}/**/{name}.so*", recursive=True))
        if hits:
            return ctypes.CDLL(hits[0], mode=ctypes.RTLD_GLOBAL)
    sys.exit(f"{name} not found under {roots}")


def ok(status, what):
    if status != 0:
        raise RuntimeError(f"{what}: cuBLAS status {status}")


def median_us(fn, reps):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="8b,27b")
    p.add_argument("--rows", default="512,4096")
    p.add_argument("--algos", type=int, default=24)
    p.add_argument("--reps", type=int, default=15)
    args = p.parse_args()

    torch.cuda.init()
    blas, lt = load("libcublas"), load("libcublasLt")
    handle, lth = ctypes.c_void_p(), ctypes.c_void_p()
    ok(blas.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
    ok(lt.cublasLtCreate(ctypes.byref(lth)), "cublasLtCreate")
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    ok(blas.cublasSetStream_v2(handle, stream), "cublasSetStream")
    ws_bytes = 64 << 20
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device="cuda")
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    print(f"gpu: {torch.cuda.get_device_name()}; cuBLAS via {blas._name}", flush=True)
    print("| model | matrix | t | default µs | TFLOP/s | Lt first µs | Lt best µs | best # | TFLOP/s | best / default |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model in args.shapes.split(","):
        for name, rows, cols, out in SHAPES[model]:
            # Several weight copies where one would sit in L2, so each run reads device memory.
            copies = max(1, min(4, (200 << 20) // (rows * cols * 2)))
            ws_list = [torch.randn(rows, cols, device="cuda").half() for _ in range(copies)]
            for t in [int(r) for r in args.rows.split(",")]:
                x = torch.randn(t, cols, device="cuda").half()
                cty = R_32F if out == "f32" else R_16F
                c = torch.empty(t, rows, device="cuda", dtype=torch.float32 if out == "f32" else torch.float16)
                k = [0]

                def gemm_ex():
                    w = ws_list[k[0] % copies]
                    k[0] += 1
                    ok(blas.cublasGemmEx(handle, OP_T, OP_N, rows, t, cols, ctypes.byref(one),
                                         ctypes.c_void_p(w.data_ptr()), R_16F, cols,
                                         ctypes.c_void_p(x.data_ptr()), R_16F, cols, ctypes.byref(zero),
                                         ctypes.c_void_p(c.data_ptr()), cty, rows, COMPUTE_32F, -1),
                       "cublasGemmEx")

                base = median_us(gemm_ex, args.reps)
                ref = c.float().clone()
                desc, la, lb, lc, pref = (ctypes.c_void_p() for _ in range(5))
                ok(lt.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, R_32F), "desc")
                opt, opn = ctypes.c_int(OP_T), ctypes.c_int(OP_N)
                ok(lt.cublasLtMatmulDescSetAttribute(desc, DESC_TRANSA, ctypes.byref(opt), ctypes.c_size_t(4)), "transa")
                ok(lt.cublasLtMatmulDescSetAttribute(desc, DESC_TRANSB, ctypes.byref(opn), ctypes.c_size_t(4)), "transb")
                ok(lt.cublasLtMatrixLayoutCreate(ctypes.byref(la), R_16F, ctypes.c_uint64(cols),
                                                 ctypes.c_uint64(rows), ctypes.c_int64(cols)), "la")
                ok(lt.cublasLtMatrixLayoutCreate(ctypes.byref(lb), R_16F, ctypes.c_uint64(cols),
                                                 ctypes.c_uint64(t), ctypes.c_int64(cols)), "lb")
                ok(lt.cublasLtMatrixLayoutCreate(ctypes.byref(lc), cty, ctypes.c_uint64(rows),
                                                 ctypes.c_uint64(t), ctypes.c_int64(rows)), "lc")
                ok(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
                wsz = ctypes.c_uint64(ws_bytes)
                ok(lt.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE, ctypes.byref(wsz), ctypes.c_size_t(8)), "ws")
                found = (Heuristic * args.algos)()
                n = ctypes.c_int()
                ok(lt.cublasLtMatmulAlgoGetHeuristic(lth, desc, la, lb, lc, lc, pref, args.algos, found,
                                                      ctypes.byref(n)), "heuristic")
                results = []
                for i in range(n.value):
                    h = found[i]
                    if h.state != 0:
                        continue

                    def lt_run(h=h):
                        w = ws_list[k[0] % copies]
                        k[0] += 1
                        ok(lt.cublasLtMatmul(lth, desc, ctypes.byref(one), ctypes.c_void_p(w.data_ptr()), la,
                                             ctypes.c_void_p(x.data_ptr()), lb, ctypes.byref(zero),
                                             ctypes.c_void_p(c.data_ptr()), lc, ctypes.c_void_p(c.data_ptr()),
                                             lc, ctypes.byref(h.algo), ctypes.c_void_p(ws.data_ptr()),
                                             ctypes.c_size_t(ws_bytes), stream), "cublasLtMatmul")

                    try:
                        us = median_us(lt_run, args.reps)
                    except RuntimeError as e:
                        print(f"  algo {i}: {e}", file=sys.stderr)
                        continue
                    # Each run used another weight copy: compare against the copy-0 reference only
                    # where one copy is all there is.
                    err = (c.float() - ref).norm().item() / ref.norm().item() if copies == 1 else float("nan")
                    results.append((us, i, err))
                flops = 2.0 * rows * cols * t
                if not results:
                    print(f"| {model} | {name} {rows}x{cols} | {t} | {base:.1f} | {flops / base / 1e6:.0f} | - | - | - | - | - |")
                    continue
                first = next(us for us, i, _ in results if i == min(j for _, j, _ in results))
                best = min(results)
                print(f"| {model} | {name} {rows}x{cols} | {t} | {base:.1f} | {flops / base / 1e6:.0f} | "
                      f"{first:.1f} | {best[0]:.1f} | {best[1]} of {n.value} | {flops / best[0] / 1e6:.0f} | "
                      f"{base / best[0]:.3f}x |", flush=True)
                print("  all: " + ", ".join(f"#{i} {us:.1f}" + (f" (err {e:.1e})" if e == e else "")
                                            for us, i, e in sorted(results, key=lambda r: r[1])),
                      file=sys.stderr, flush=True)
                for h in (la, lb, lc):
                    lt.cublasLtMatrixLayoutDestroy(h)
                lt.cublasLtMatmulDescDestroy(desc)
                lt.cublasLtMatmulPreferenceDestroy(pref)
            del ws_list


if __name__ == "__main__":
    main()
