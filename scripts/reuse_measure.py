#!/usr/bin/env python3
# Repeated-prompt and shared-prefix reuse on a running server: prompt line, TTFT, KV bytes.
import json, sys, time, urllib.request
addr = sys.argv[1]
def post(body):
    t = time.time()
    req = urllib.request.Request(f"http://{addr}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        out = json.loads(r.read()); line = r.headers.get("x-tandem-prompt")
    return time.time() - t, line
def kv():
    text = urllib.request.urlopen(f"http://{addr}/metrics").read().decode()
    vals = {}
    for l in text.splitlines():
        if l.startswith("tandem_kv_cache_bytes"):
            k, v = l.split(); vals[k] = int(float(v))
    return vals
words = open(sys.argv[2]).read().split()
long = " ".join(words[:1150])
for i in range(3):
    dt, line = post({"prompt": long, "n_predict": 1, "temperature": 0, "cache_prompt": True})
    print(f"repeated #{i+1}: {dt*1000:.0f} ms  {line}  {kv()}")
system = " ".join(words[:760])
for q in ["Who wrote this license?", "Can I sell copies of the program?"]:
    dt, line = post({"prompt": system + "\n\n" + q, "n_predict": 1, "temperature": 0})
    print(f"shared prefix: {dt*1000:.0f} ms  {line}  {kv()}")
