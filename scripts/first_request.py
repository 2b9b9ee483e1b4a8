#!/usr/bin/env python3
"""Times a server's start and its first requests: how long `tandem serve` (or `llama-server`) takes
until /health answers, then each of --requests prompts of --words words (different words each, so
no prefix is reused) sent to the llama.cpp-style /completion route with n_predict 1: wall time and
the server's own prompt_ms. One line of JSON per request, then a summary line.

  scripts/first_request.py --port 8090 -- tandem serve -m model.gguf --device cuda --port 8090
"""
import argparse
import json
import subprocess
import sys
import time
import urllib.request


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--words", type=int, default=400)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--label", default="")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    base = f"http://127.0.0.1:{a.port}"
    t0 = time.perf_counter()
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sys.stderr)
    try:
        while True:
            if server.poll() is not None:
                sys.exit(f"server exited with {server.returncode} before answering")
            try:
                urllib.request.urlopen(base + "/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.05)
        ready = time.perf_counter() - t0
        walls = []
        for i in range(a.requests):
            prompt = " ".join(f"w{i}x{j}" for j in range(a.words))
            t = time.perf_counter()
            r = post(base + "/completion", {"prompt": prompt, "n_predict": 1, "temperature": 0})
            wall = (time.perf_counter() - t) * 1e3
            walls.append(wall)
            tm = r.get("timings", {})
            print(json.dumps({"label": a.label, "request": i, "wall_ms": round(wall, 1),
                              "prompt_n": tm.get("prompt_n"), "prompt_ms": tm.get("prompt_ms")}))
        print(json.dumps({"label": a.label, "ready_s": round(ready, 2), "first_ms": round(walls[0], 1),
                          "later_ms": [round(w, 1) for w in walls[1:]]}))
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
