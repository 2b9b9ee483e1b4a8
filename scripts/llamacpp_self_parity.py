#!/usr/bin/env python3
"""How well does llama.cpp agree with itself? The parity goldens mix two of its CPU routes.

Prompt positions in `golden-visible.json` come from its prefill route (512-row ubatches: tinyBLAS,
repacked GEMMs), the greedy steps from its decode route (one row: `vec_dot` kernels). The two sum in
different orders, so the same position gets different logits. This script measures that gap on the
golden prompts with the probe from `scripts/llamacpp_probe.sh` (flash attention off, 2 threads):

  1. every prompt position read in 512-row ubatches against the same position read one token at a time;
  2. prompt + golden greedy tokens teacher-forced through the prefill route, against the golden greedy ids.

An engine whose logits do not depend on chunking (Tandem's contract) computes a position one way, so it
cannot reproduce both routes; the flips below bound the margin at which top-1 parity is meaningful.

  bash scripts/llamacpp_probe.sh && python3 scripts/llamacpp_self_parity.py [GOLDEN_JSON]
"""
import json
import os
import subprocess
import sys

PROBE = "/tmp/llamacpp-probe/logits"
MODELS = os.path.expanduser(os.environ.get("TANDEM_MODELS", "~/.cache/tandem/models"))
FILES = {
    "gemma3-270m-q4_k_m": "gemma-3-270m-q4_k_m.gguf",
    "smollm2-135m-instruct-q4_1": "SmolLM2-135M-Instruct.Q4_1.gguf",
}


def probe(path, ids, chunk):
    """Top-5 (id, logit) per position, reading `ids` in chunks of `chunk` rows."""
    env = dict(os.environ, CHUNK=str(chunk))
    out = subprocess.run([PROBE, path, "0", "2"] + [str(i) for i in ids], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"probe failed on {path}: {out.stderr[-500:]}")
    rows = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if parts and parts[0].isdigit():
            rows[int(parts[0])] = [(int(a.split(":")[0]), float(a.split(":")[1])) for a in parts[1:]]
    return rows


def main():
    golden_path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/golden-visible.json"
    golden = json.load(open(golden_path))
    table = []
    for key, file in FILES.items():
        path = os.path.join(MODELS, file)
        for p in golden["models"][key]["prompts"]:
            ids = p["ids"]
            batched, single = probe(path, ids, 512), probe(path, ids, 1)
            max_diff, flips = 0.0, []
            for pos, top in batched.items():
                other = dict(single[pos])
                max_diff = max([max_diff] + [abs(v - other[i]) for i, v in top if i in other])
                margin = top[0][1] - top[1][1]
                if top[0][0] != single[pos][0][0] and margin >= 0.1:
                    flips.append(f"{pos}@{margin:.2f}")
            forced = probe(path, ids + p["greedy_ids"][:-1], 512)
            greedy = []
            for step, want in enumerate(p["greedy_ids"]):
                margin = p["greedy_top2_margin"][step]
                if forced[len(ids) - 1 + step][0][0] != want and margin >= 0.1:
                    greedy.append(f"step {step}@{margin:.2f}")
            table.append((key.split("-")[0], p["name"], len(ids), max_diff, flips, greedy))
    print("| model | prompt | tokens | max |Δlogit| prefill vs decode | top-1 flips, margin ≥ 0.1 | greedy steps the prefill route misses, margin ≥ 0.1 |")
    print("|---|---|---:|---:|---|---|")
    for model, name, n, diff, flips, greedy in table:
        shown = ", ".join(flips[:8]) + (f" (+{len(flips) - 8})" if len(flips) > 8 else "")
        print(f"| {model} | {name} | {n} | {diff:.3f} | {shown or '-'} | {', '.join(greedy) or '-'} |")


if __name__ == "__main__":
    main()
