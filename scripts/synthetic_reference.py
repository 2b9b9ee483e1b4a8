#!/usr/bin/env python3
"""llama.cpp's answers on small synthetic models, for the parity test of architectures no real model
on the package index has (qwen3, qwen3moe): `crates/tandem-cli/tests/synthetic_parity.rs` reads
`tests/data/synthetic-parity.json`, writes the same files with `tandem synth` (the same seed gives the
same bytes), checks their sha256 and compares its own logits with these.

    python3 scripts/synthetic_reference.py --tandem target/release/tandem \
        --llama /path/to/llama.cpp --build build   # `<llama>/<build>/bin/libllama.so` (cmake --target llama)

Each prompt is BOS then seeded ids of the byte-level vocabulary; llama.cpp (CPU, flash attention
off, 2 threads) reads it in 512-row batches and decodes GREEDY tokens one row at a time.
"""
import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = [
    ("qwen3-tiny", ["--arch", "qwen3", "--shape", "tiny", "--seed", "1"]),
    ("qwen3moe-tiny", ["--arch", "qwen3moe", "--shape", "qwen3-moe-tiny", "--seed", "1"]),
    ("qwen3moe-tiny-skewed", ["--arch", "qwen3moe", "--shape", "qwen3-moe-tiny", "--seed", "2", "--route-skew", "1"]),
]
PROMPT_LENGTHS = [6, 150, 700]
GREEDY = 32
BOS = 256


def prompts():
    rng = random.Random(47)
    ordinary = [i for i in range(1, 512) if i not in (256, 257)]
    return [[BOS] + [rng.choice(ordinary) for _ in range(n - 1)] for n in PROMPT_LENGTHS]


def build_probe(llama, build, out):
    lib = os.path.join(llama, build, "bin")
    cmd = [
        "gcc", "-O2", "-o", out, os.path.join(ROOT, "scripts", "llamacpp_reference.c"),
        "-I" + os.path.join(llama, "include"), "-I" + os.path.join(llama, "ggml", "include"),
        "-L" + lib, "-lllama", "-lm", "-Wl,-rpath," + lib,
    ]
    subprocess.run(cmd, check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--llama", required=True)
    ap.add_argument("--build", default="build", help="llama.cpp's cmake build folder, relative to --llama")
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "synthetic-parity.json"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="tandem-synref-")
    probe = os.path.join(work, "reference")
    build_probe(args.llama, args.build, probe)
    ps = prompts()
    stdin = "\n".join(" ".join(map(str, p)) for p in ps) + "\n"
    version = subprocess.run(["git", "-C", args.llama, "describe", "--tags"], capture_output=True, text=True).stdout.strip()
    result = {
        "about": "llama.cpp b11434 (CPU, flash attention off, 2 threads, 512-row batches; greedy steps one row "
        "at a time) on files written by `tandem synth`; made by scripts/synthetic_reference.py",
        "llama_cpp": version or "b11434",
        "models": [],
    }
    for name, synth in MODELS:
        path = os.path.join(work, name + ".gguf")
        subprocess.run([args.tandem, "synth", *synth, "-o", path], check=True, capture_output=True)
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
        out = subprocess.run([probe, path, "2", str(GREEDY)], input=stdin, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"{name}: llama.cpp failed: {out.stderr}")
        ref = json.loads(out.stdout)
        result["models"].append({"name": name, "synth": synth, "sha256": digest, **ref})
        nll = ", ".join(f"{p['mean_nll']:.4f}" for p in ref["prompts"])
        print(f"{name}: sha256 {digest[:16]}…, mean NLL {nll}", file=sys.stderr)
    with open(args.out, "w") as f:
        json.dump(result, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
