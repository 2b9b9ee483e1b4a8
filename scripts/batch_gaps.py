#!/usr/bin/env python3
"""Whether a server's first decode steps at a batch size cost more than later ones: against a running
server, for each group size N in --groups, N streaming /completion requests sent at once (prompts of
--words words, different for every request, n_predict --tokens), and the gaps between a stream's
tokens measured here. Each pass runs every group in turn; the first pass meets each batch size for
the first time, later passes again. One JSON line a (pass, group): the largest gap, the median
gap, the largest time to first token, in ms.

  scripts/batch_gaps.py --port 8090 --groups 4,12,24,48 --passes 2
"""
import argparse
import http.client
import json
import statistics
import threading
import time


def stream(port, prompt, n, out):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0, "stream": True})
    t0 = time.perf_counter()
    conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    stamps = []
    for raw in r:
        line = raw.decode().strip()
        if line.startswith("data:") and '"content"' in line:
            stamps.append(time.perf_counter())
    conn.close()
    out.append((t0, stamps))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--groups", default="4,12,24,48")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--words", type=int, default=20)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    k = 0
    for p in range(a.passes):
        for n in [int(g) for g in a.groups.split(",")]:
            out = []
            threads = []
            for i in range(n):
                k += 1
                prompt = " ".join(f"r{k}w{j}" for j in range(a.words))
                threads.append(threading.Thread(target=stream, args=(a.port, prompt, a.tokens, out)))
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            gaps = [(b - c) * 1e3 for _, s in out for c, b in zip(s, s[1:])]
            ttft = [(s[0] - t0) * 1e3 for t0, s in out if s]
            print(json.dumps({"label": a.label, "pass": p + 1, "streams": n, "tokens": sum(len(s) for _, s in out),
                              "max_gap_ms": round(max(gaps), 1) if gaps else None,
                              "median_gap_ms": round(statistics.median(gaps), 2) if gaps else None,
                              "max_ttft_ms": round(max(ttft), 1) if ttft else None}), flush=True)


if __name__ == "__main__":
    main()
