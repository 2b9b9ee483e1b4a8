#!/usr/bin/env bash
# On the GPU machine: `tandem serve --device cuda` end to end, in under 3 minutes. For each mode
# (--deterministic, then the default routes) it starts the server on a free loopback port and checks:
#   - 8 concurrent greedy /completion requests (32 tokens, different prompts) all succeed, batched;
#   - one of those prompts sent alone (prefix cache flushed first) gives the same tokens as in the batch:
#     bit-identical tokens and logprobs with --deterministic; without it the batch takes the GEMM route
#     and the lone request the matvec route, so only the tokens are compared (a near tie is reported);
#   - a two-turn chat: turn 2 reuses turn 1's KV (cut back to the shared prefix), and gives what the
#     same turn gives read afresh;
#   - a follow-up past the sliding window: the rings have moved on, so the KV comes back from the
#     checkpoint taken at the end of the first prompt (device-to-device copies), and again matches a
#     fresh read.
# Prints a table; exits non-zero when any check fails.
#
#   bash scripts/gpu_serve_check.sh MODEL.gguf
#   (e.g. .gpu/tandem synth --arch gemma3 --shape gemma3-270m --seed 1 -o /tmp/g.gguf first)
#
# Environment: TANDEM (binary, default .gpu/tandem), MODES ("deterministic default"), CTX (2048),
# WORK (scratch dir), DEVICE (cuda; `cpu` runs the same checks where there is no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?usage: bash scripts/gpu_serve_check.sh MODEL.gguf}
B=${TANDEM:-.gpu/tandem}
W=${WORK:-/tmp/tandem-serve-check}
mkdir -p "$W"
if [ "${DEVICE:-cuda}" = cuda ]; then
  source scripts/gpu_env.sh >/dev/null
fi
export TANDEM_KERNEL_CACHE="$W/kernels"

timeout 175 python3 - "$B" "$MODEL" "${DEVICE:-cuda}" "${MODES:-deterministic default}" "${CTX:-2048}" "$W" <<'EOF'
import json, os, signal, socket, subprocess, sys, threading, time, urllib.request, urllib.error

binary, model, device, modes, ctx, work = sys.argv[1:7]
ADMIN = "serve-check-admin"
START = time.time()
rows, failed = [], False

def report(mode, check, ok, detail):
    global failed
    failed |= not ok
    rows.append((mode, check, "ok" if ok else "FAIL", detail))
    print(f"[{time.time() - START:6.1f}s] {mode}: {check}: {'ok' if ok else 'FAIL'} ({detail})", flush=True)

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def call(port, path, body=None, admin=False, timeout=120):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="POST" if body is not None else "GET")
    req.add_header("Content-Type", "application/json")
    if admin:
        req.add_header("Authorization", f"Bearer {ADMIN}")
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(req, data, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return 0, str(e)

def completion(port, prompt, n=32):
    status, body = call(port, "/completion", {
        "prompt": prompt, "n_predict": n, "temperature": 0, "n_probs": 2, "ignore_eos": True})
    if status != 200:
        return None, f"HTTP {status}: {str(body)[:200]}"
    probs = body["completion_probabilities"]
    return {
        "tokens": body["tokens"],
        "logprobs": [p["logprob"] for p in probs],
        "margins": [p["top_logprobs"][0]["logprob"] - p["top_logprobs"][1]["logprob"]
                    if len(p["top_logprobs"]) > 1 else float("inf") for p in probs],
        "reused": body["timings"]["cache_n"],
        "prompt_n": body["tokens_evaluated"],
    }, None

def compare(a, b, exact):
    """(ok, detail) for two generations of the same prompt."""
    if a["tokens"] == b["tokens"]:
        if a["logprobs"] == b["logprobs"]:
            return True, f"{len(a['tokens'])} tokens, logprobs bit-identical"
        worst = max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"]))
        return not exact, f"same {len(a['tokens'])} tokens, logprobs differ by up to {worst:.2e}"
    i = next(i for i, (x, y) in enumerate(zip(a["tokens"] + [None], b["tokens"] + [None])) if x != y)
    margin = min(a["margins"][i], b["margins"][i]) if i < min(len(a["margins"]), len(b["margins"])) else 0.0
    near_tie = margin < 0.05
    detail = f"tokens differ from position {i} (top-2 margin there {margin:.3g} nats)"
    return (not exact and near_tie), detail + (": a near tie" if near_tie else "")

def flush(port):
    status, _ = call(port, "/admin/cache/flush", {}, admin=True)
    return status == 200

def start_server(mode, port):
    args = [binary, "serve", "-m", model, "--port", str(port), "--ctx", ctx, "--admin-key", ADMIN,
            "--device", device, "--verbose"]
    if mode == "deterministic":
        args.append("--deterministic")
    log = open(os.path.join(work, f"serve-{mode}.log"), "w")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 110
    while time.time() < deadline:
        if proc.poll() is not None:
            return proc, f"the server exited with {proc.returncode}"
        if call(port, "/health", timeout=2)[0] == 200:
            return proc, None
        time.sleep(0.2)
    return proc, "the server did not answer /health within 110 s"

def stop_server(proc):
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()

PROMPTS = [
    "The capital of France is", "fn main() {", "Once upon a time", "The three primary colors are",
    "def fibonacci(n):", "Water boils at", "The largest planet in the solar system", "In 1969, astronauts",
]

def check_mode(mode, port):
    exact = mode == "deterministic"
    # 8 at once, released together; /slots is polled meanwhile to see that they ran side by side.
    results, errors = [None] * 8, [None] * 8
    gate, done = threading.Barrier(8), threading.Event()
    most = [0]
    def one(i):
        gate.wait()
        results[i], errors[i] = completion(port, PROMPTS[i])
    def watch():
        while not done.is_set():
            status, body = call(port, "/slots", admin=True, timeout=5)
            if status == 200:
                most[0] = max(most[0], body["running"])
            time.sleep(0.002)
    watcher = threading.Thread(target=watch)
    watcher.start()
    t0 = time.time()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.time() - t0
    done.set()
    watcher.join()
    good = sum(r is not None and len(r["tokens"]) == 32 for r in results)
    detail = f"{good}/8 gave 32 tokens in {took:.2f} s, up to {most[0]} running at once"
    bad = [e for e in errors if e]
    report(mode, "8 concurrent /completion", good == 8 and most[0] >= 2, detail + (f"; {bad[0]}" if bad else ""))
    if good != 8:
        return

    # The same prompt alone: flushed first, so it reads its prompt rather than reusing the batch's KV.
    flush(port)
    lone, err = completion(port, PROMPTS[3])
    if lone is None:
        report(mode, "lone vs batched", False, err)
    else:
        ok, detail = compare(results[3], lone, exact)
        report(mode, "lone vs batched" + (" (bit-identical required)" if exact else " (tokens)"), ok, detail)

    # Two-turn chat: turn 2 reuses turn 1's KV, cut back to the shared prefix.
    messages = [{"role": "user", "content": "Tell me about the sea, in a few words."}]
    def chat(msgs):
        return call(port, "/v1/chat/completions", {
            "messages": msgs, "max_tokens": 32, "temperature": 0, "logprobs": True, "top_logprobs": 2})
    def as_gen(r):
        # Tokens as their bytes, which is what the chat route reports of them.
        entries = r["choices"][0]["logprobs"]["content"]
        return {"tokens": [e["bytes"] for e in entries], "logprobs": [e["logprob"] for e in entries],
                "margins": [e["top_logprobs"][0]["logprob"] - e["top_logprobs"][1]["logprob"]
                            if len(e["top_logprobs"]) > 1 else float("inf") for e in entries]}
    status, first = chat(messages)
    if status != 200:
        report(mode, "chat turn 1", False, f"HTTP {status}: {str(first)[:200]}")
        return
    reply = first["choices"][0]["message"]["content"]
    turn1_prompt = first["usage"]["prompt_tokens"]
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And the mountains?"}]
    status, second = chat(messages)
    if status != 200:
        report(mode, "chat turn 2", False, f"HTTP {status}: {str(second)[:200]}")
        return
    reused = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    prompt2 = second["usage"]["prompt_tokens"]
    report(mode, "chat turn 2 reuses turn 1", reused >= turn1_prompt,
           f"prompt {prompt2} = {reused} reused + {prompt2 - reused} read; turn 1's prompt was {turn1_prompt}")
    flush(port)
    status, fresh = chat(messages)
    if status != 200:
        report(mode, "chat turn 2 afresh", False, f"HTTP {status}: {str(fresh)[:200]}")
        return
    ok, detail = compare(as_gen(second), as_gen(fresh), exact)
    report(mode, "turn 2 reused = turn 2 afresh", ok and fresh["usage"]["prompt_tokens_details"]["cached_tokens"] == 0,
           detail)

    # Past the window: 600 prompt tokens then 32 generated move every ring beyond position 600, so a
    # follow-up diverging there is served from the checkpoint at the end of the first prompt.
    long = [32 + (i * 37) % 90 for i in range(600)]
    first, err = completion(port, long)
    if first is None:
        report(mode, "long prompt", False, err)
        return
    follow = long + [33 + (i * 11) % 90 for i in range(20)]
    # Diverge right at 600, whatever the model said there.
    if follow[600] == first["tokens"][0]:
        follow[600] = 34
    again, err = completion(port, follow)
    if again is None:
        report(mode, "follow-up past the ring", False, err)
        return
    report(mode, "follow-up past the window (checkpoint restore)", again["reused"] == 600,
           f"prompt {again['prompt_n']} = {again['reused']} reused + {again['prompt_n'] - again['reused']} read")
    flush(port)
    fresh, err = completion(port, follow)
    if fresh is None:
        report(mode, "follow-up afresh", False, err)
        return
    ok, detail = compare(again, fresh, exact)
    report(mode, "restored = afresh", ok and fresh["reused"] == 0, detail)

for mode in modes.split():
    port = free_port()
    proc, err = start_server(mode, port)
    try:
        if err:
            report(mode, "start", False, err)
        else:
            report(mode, "start", True, f"{device}, port {port}, ready after {time.time() - START:.0f} s")
            check_mode(mode, port)
    finally:
        stop_server(proc)
    log = open(os.path.join(work, f"serve-{mode}.log")).read()
    if err or failed:
        print(f"--- last lines of serve-{mode}.log:\n" + "\n".join(log.splitlines()[-15:]))
    elif "gpu memory" in log:
        print("   " + next(l for l in log.splitlines() if l.startswith("gpu memory")))

print(f"\n`tandem serve --device {device}` on {os.path.basename(model)}, {time.time() - START:.0f} s\n")
print("| mode | check | result | detail |")
print("|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(r) + " |")
sys.exit(1 if failed else 0)
EOF
status=$?
[ $status -eq 124 ] && echo "gpu_serve_check: stopped after 175 s"
exit $status
