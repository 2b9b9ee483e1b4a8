#!/usr/bin/env python3
"""A long first turn and a follow-up that reuses it, on one `tandem serve` (issue 47's follow-up
turn): TTFT of each, the server's prompt line (rows reused) and the expert-stream lines `--trace`
printed for each request (copied and skipped experts, link rate). Prompts are random token ids, so
nothing but the first turn itself is reused.

  scripts/moe_followup.py --tandem .gpu/tandem --model slice.gguf --first 8192 --new 512 -- \
      --device cuda --gpu-expert-budget 0
"""
import argparse
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def first_token(port, ids, timeout):
    """A one-token greedy completion: (seconds to its end, the prompt line, the token id)."""
    body = json.dumps({"prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": 1})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        text = r.read()
        took = time.perf_counter() - t0
        if r.status != 200:
            raise RuntimeError(f"{r.status} {text[:300]!r}")
        out = json.loads(text)
        line = r.headers.get("x-tandem-prompt", "")
        token = out["choices"][0].get("logprobs", {}) or {}
        return took, line, token
    finally:
        conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tandem", default=".gpu/tandem")
    ap.add_argument("--model", required=True)
    ap.add_argument("--first", type=int, nargs="+", default=[8192], help="first turns' tokens")
    ap.add_argument("--new", type=int, default=512, help="the follow-up's new tokens")
    ap.add_argument("--vocab", type=int, default=32000, help="token ids are drawn below this")
    ap.add_argument("--log", default="followup-serve.log")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("serve_args", nargs="*", help="after --: more `tandem serve` arguments")
    args = ap.parse_args()
    port = free_port()
    ctx = max(args.first) + args.new + 64
    cmd = [args.tandem, "serve", "-m", args.model, "--port", str(port), "--ctx", str(ctx), "--trace"]
    cmd += args.serve_args
    log = open(args.log, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + args.timeout
        while True:
            if proc.poll() is not None:
                sys.exit(f"serve exited with {proc.returncode}; see {args.log}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                sys.exit(f"serve not up within {args.timeout} s")
            time.sleep(0.2)
        rng = random.Random(1)
        rows = []
        for n in args.first:
            first = [rng.randrange(16, args.vocab) for _ in range(n)]
            follow = first + [rng.randrange(16, args.vocab) for _ in range(args.new)]
            for label, ids in [("first turn", first), ("follow-up", follow)]:
                mark = os.path.getsize(args.log)
                took, line, _ = first_token(port, ids, args.timeout)
                time.sleep(0.2)
                with open(args.log) as f:
                    f.seek(mark)
                    streams = [l.strip() for l in f if "expert stream" in l]
                rows.append((n, label, len(ids), took, line, streams))
        print("\n| first turn | request | prompt tokens | seconds to the token | prompt line | expert stream (trace) |")
        print("|---:|---|---:|---:|---|---|")
        for n, label, count, took, line, streams in rows:
            s = "; ".join(streams) or "no streamed chunk"
            print(f"| {n:,} | {label} | {count:,} | {took:.3f} | {line} | {s} |")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
