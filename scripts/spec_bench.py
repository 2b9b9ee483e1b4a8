#!/usr/bin/env python3
"""Decode speed with and without speculative decoding, Tandem against llama.cpp, on texts.

    python3 scripts/spec_bench.py --tandem target/release/tandem --llama-bin <llama.cpp>/build/bin \\
        --model smollm2-135m=~/.cache/tandem/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --text bench/spec/code.txt --text bench/spec/licence.txt --text bench/spec/story.txt \\
        --threads 2 --rounds 2 --json out.json

For each model and text, four arms decode `-n` tokens greedily after the text:
  tandem        `tandem bench -p 0 -n N -r R --prompt-file TEXT --spec off` (decode tok/s, warm repetitions)
  tandem-lookup the same with `--spec lookup` (adaptive draft length, `--draft-max`)
  llama         `llama-lookup -n N -f TEXT --spec-draft-n-max 0 --temp 0` (its loop with no drafts)
  llama-lookup  `llama-lookup -n N -f TEXT --spec-draft-n-max K --temp 0` (its n-gram lookup decoding)
llama-lookup times decoding apart from reading the prompt, as `tandem bench` does.
Each round runs the arms in the order A B C D, then D C B A, so drift falls on every arm alike; each
arm's number is the median of its runs. Pairs of adjacent runs give the ratios: Tandem's lookup over
its plain decode, llama.cpp's lookup over its plain decode, and Tandem's lookup over llama.cpp's, each
the median of the per-round ratios. Acceptance and tokens per step come from Tandem's JSON and
llama-lookup's log. Prints a markdown table last.
"""

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys

ARMS = ("tandem", "tandem-lookup", "llama", "llama-lookup")


def run(cmd, timeout):
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {cmd}\n{p.stderr[-2000:]}")
    return p.stdout + p.stderr


def measure(arm, args, model, text):
    q = shlex.quote
    if arm.startswith("tandem"):
        spec = "lookup" if arm == "tandem-lookup" else "off"
        cmd = (f"{q(args.tandem)} bench -m {q(model)} -t {args.threads} -p 0 -n {args.n} -r {args.reps} "
               f"--prompt-file {q(text)} --spec {spec} --draft-max {args.draft_max} --output-format json "
               f"{args.tandem_args}")
        out = run(cmd, args.timeout)
        row = json.loads(out[out.index("["):out.rindex("]") + 1])[0]
        return {"tok_s": row["tok_s"], "acceptance": row.get("acceptance"),
                "tokens_per_step": row.get("tokens_per_step")}
    draft = 0 if arm == "llama" else args.draft_max
    cmd = (f"{q(os.path.join(args.llama_bin, 'llama-lookup'))} -m {q(model)} -t {args.threads} -c 4096 "
           f"-n {args.n} -f {q(text)} --spec-draft-n-max {draft} --temp 0 {args.llama_args}")
    out = run(cmd, args.timeout)
    speeds = re.findall(r"decoded\s+\d+ tokens in\s+[0-9.]+ s(?:econds)?, speed:\s+([0-9.]+) t/s", out)
    if not speeds:
        sys.exit(f"no decode speed in the output of {cmd}:\n{out[-2000:]}")
    r = {"tok_s": float(speeds[-1])}
    acc = re.search(r"accept\s+=\s+([0-9.]+)%", out)
    if acc:
        r["acceptance"] = float(acc.group(1)) / 100
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tandem", default="target/release/tandem")
    ap.add_argument("--tandem-args", default="", help="more `tandem bench` arguments (e.g. --device cuda)")
    ap.add_argument("--llama-bin", required=True, help="folder with llama-lookup")
    ap.add_argument("--llama-args", default="", help="more llama-lookup arguments (e.g. -ngl 99)")
    ap.add_argument("--model", action="append", required=True, metavar="NAME=PATH")
    ap.add_argument("--text", action="append", required=True)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--reps", type=int, default=1, help="tandem bench -r (after its warm-up repetition)")
    ap.add_argument("--draft-max", type=int, default=8)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=2, help="A B C D D C B A blocks")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    rows = []
    for spec in args.model:
        name, path = spec.split("=", 1)
        path = os.path.expanduser(path)
        for text in args.text:
            runs = {a: [] for a in ARMS}
            order = []
            for _ in range(args.rounds):
                order += list(ARMS) + list(reversed(ARMS))
            for arm in order:
                r = measure(arm, args, path, text)
                runs[arm].append(r)
                print(f"{name} {os.path.basename(text)} {arm}: {r}", file=sys.stderr, flush=True)
            med = {a: statistics.median(r["tok_s"] for r in runs[a]) for a in ARMS}

            def paired(b, a):
                return statistics.median(x["tok_s"] / y["tok_s"] for x, y in zip(runs[b], runs[a]))

            row = {
                "model": name, "text": os.path.basename(text), "median_tok_s": med,
                "tandem_gain": paired("tandem-lookup", "tandem"),
                "llama_gain": paired("llama-lookup", "llama"),
                "tandem_vs_llama_lookup": paired("tandem-lookup", "llama-lookup"),
                "tandem_acceptance": statistics.median(r["acceptance"] for r in runs["tandem-lookup"]),
                "tandem_tokens_per_step": statistics.median(r["tokens_per_step"] for r in runs["tandem-lookup"]),
                "llama_acceptance": statistics.median(r.get("acceptance") or 0 for r in runs["llama-lookup"]),
                "runs": runs,
            }
            rows.append(row)
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)
    print("| model | text | Tandem tok/s off / lookup | gain | acceptance, tokens/step | "
          "llama.cpp tok/s no drafts / lookup | gain | acceptance | Tandem lookup / llama.cpp lookup |")
    print("|---|---|---|---:|---|---|---:|---:|---:|")
    for r in rows:
        m = r["median_tok_s"]
        print(f"| {r['model']} | {r['text']} | {m['tandem']:.1f} / {m['tandem-lookup']:.1f} | "
              f"{r['tandem_gain']:.2f}x | {r['tandem_acceptance']:.2f}, {r['tandem_tokens_per_step']:.2f} | "
              f"{m['llama']:.1f} / {m['llama-lookup']:.1f} | {r['llama_gain']:.2f}x | "
              f"{r['llama_acceptance']:.2f} | {r['tandem_vs_llama_lookup']:.2f}x |")


if __name__ == "__main__":
    main()
