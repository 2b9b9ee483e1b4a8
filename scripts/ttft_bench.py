#!/usr/bin/env python3
"""Time to first token, local prefill against disaggregated (remote) prefill (issue 48's benchmark).

For each model it starts, on loopback:
  - a local server: `tandem serve --role both --device cpu` (reads every prompt itself);
  - per rate cap, a prefill node `tandem serve --role prefill --device <dev> [--kv-send-rate R]` and a
    decode node `tandem serve --role decode --device cpu --prefill-peer <that node>`;
then, per prompt length, sends the same kind of prompt to the local server and to every decode node in
the order A B ... B A (forward, then backward, repeated), and reports medians of the warm samples (the
first `--discard` samples of each arm at each length are thrown away). Before any length, every arm
reads one short prompt, thrown away too. From `--long-from` tokens on (default 16384) the local arm
takes `--long-local-reps` samples (default 1) and throws none away: one CPU prefill of 32k tokens takes
minutes, its process is warm from the shorter lengths, and its spread is small against its length.
With `--deadline`, a length that looks like it would overrun its model's share of the time (guessed
from the lengths done) is skipped, and says so.

TTFT here is what a client sees: from sending a streamed `POST /v1/completions` (the prompt as token
ids, `max_tokens` 1, greedy, on an already open connection) to the first SSE event that carries the
generated token. A remote TTFT thus holds the request to the decode node, its request to the prefill
node, the prefill there, the whole KV stream (paced by the cap) and its install, and the last prompt
token read on the decode node; a local one holds the whole prefill on the CPU.

Every sample's prompt is different from its first token after BOS on (a unique record tag, then random
words), so neither side's prefix cache can skip any of the prefill: the engine reuses a cached
conversation only for a shared prefix of 16 tokens or more. The script checks it: each response's
prompt line (`tandem.prompt_cache` of the last chunk) must say `0 reused`, a remote sample's must say
`(remote prefill)`, and the decode node's `tandem_remote_prefill_total` must go up by one per remote
sample with no fallback counted. KV bytes per prompt token are the decode node's
`tandem_kv_received_bytes_total` delta (the wire stream, framing included) over the prompt tokens.

The prefill node runs without `--deterministic` (which would send every GPU matmul down the matvec route,
a slow prefill): this times the route a production prefill node takes. Its KV differs from a CPU
prefill's in the last bits, which does not matter for time.

Models (pass them as NAME=PATH; any GGUF works; `tandem synth` files time as trained ones do):
  - Gemma 3 270M (rings: 5 layers of 6 keep a 512-token sliding window; context 32768):
      ~/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf  (`tandem pull gemma3-270m`), or
      tandem synth --arch gemma3 --shape gemma3-270m --quant q4_k_m -o /tmp/gemma3-270m.gguf
  - a llama-shaped model without rings: SmolLM2-135M,
      ~/.cache/tandem/models/SmolLM2-135M-Instruct.Q4_1.gguf  (`tandem pull smollm2-135m`), or
      tandem synth --arch llama --shape smollm2-135m --quant q4_1 -o /tmp/smollm2-135m.gguf
    Its trained context is 8192 and no synth llama shape has a longer one (tiny 512, smollm2-135m and
    llama3-8b 8192); the servers get `--ctx` past the longest prompt, and the engine takes positions past
    the trained length (RoPE goes on; the prompts are random words, only time matters here). A llama
    shape of 1B or more would make the local CPU prefill of 32k tokens take many minutes.
  Synthesized files carry a byte-level BPE vocabulary, so /tokenize works as for the real ones.

On the GPU machine (two synthesized models, ~6 minutes; logs and JSON under $OUT):
  .gpu/tandem synth --arch gemma3 --shape gemma3-270m --quant q4_k_m -o /tmp/gemma3-270m.gguf
  .gpu/tandem synth --arch llama --shape smollm2-135m --quant q4_1 -o /tmp/smollm2-135m.gguf
  python3 scripts/ttft_bench.py --tandem .gpu/tandem --device cuda \
      --model gemma3-270m=/tmp/gemma3-270m.gguf --model smollm2-135m=/tmp/smollm2-135m.gguf \
      --lengths 2048 8192 32768 --rates none,10gbit,1gbit --reps 2 --discard 1 \
      --deadline 330 --log-dir $OUT/logs --out $OUT/ttft.json

CPU to CPU, short (a check that it all works):
  python3 scripts/ttft_bench.py --tandem target/release/tandem --device cpu \
      --model gemma3-270m=~/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf --lengths 300 600 --reps 2

Only the Python standard library is used. Children are killed at exit (normal, error, Ctrl-C, SIGTERM).
"""

import argparse
import atexit
import http.client
import json
import math
import os
import random
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

T0 = time.monotonic()
CHILDREN = []
PROBLEMS = []
SKIPPED = []


def log(msg):
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


def kill_children():
    for p in CHILDREN:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                p.kill()
    for p in CHILDREN:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    CHILDREN.clear()


def on_signal(signum, _frame):
    kill_children()
    sys.exit(128 + signum)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One `tandem serve` child on a loopback port; its stderr goes to a log file."""

    def __init__(self, name, tandem, args, log_dir):
        self.name = name
        self.port = free_port()
        self.log_path = os.path.join(log_dir, f"{name}.log")
        cmd = [tandem, "serve", "--port", str(self.port)] + args
        self.cmd = cmd
        with open(self.log_path, "w") as f:
            f.write(" ".join(shlex.quote(c) for c in cmd) + "\n")
        logf = open(self.log_path, "a")
        # A session of its own, so that killing its group takes any helper it starts too.
        self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        logf.close()
        CHILDREN.append(self.proc)

    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def tail(self, n=15):
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def request(self, method, path, body=None, timeout=600):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = None if body is None else json.dumps(body)
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            r = conn.getresponse()
            return r.status, r.read().decode("utf-8", "replace")
        finally:
            conn.close()

    def up(self):
        try:
            status, _ = self.request("GET", "/health", timeout=2)
            return status == 200
        except OSError:
            return False

    def metrics(self):
        status, text = self.request("GET", "/metrics")
        if status != 200:
            raise RuntimeError(f"{self.name}: /metrics gave {status}")
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name, value = line.rsplit(" ", 1)
            try:
                out[name] = float(value)
            except ValueError:
                pass
        return out


def wait_up(nodes, timeout):
    deadline = time.monotonic() + timeout
    pending = list(nodes)
    while pending:
        for n in list(pending):
            if n.proc.poll() is not None:
                raise RuntimeError(f"{n.name} exited with {n.proc.returncode}:\n{n.tail()}")
            if n.up():
                log(f"  {n.name} up on :{n.port}")
                pending.remove(n)
        if pending and time.monotonic() > deadline:
            names = ", ".join(n.name for n in pending)
            raise RuntimeError(f"not up within {timeout} s: {names}\n{pending[0].tail()}")
        time.sleep(0.1)


WORD_PARTS = ["ka", "lo", "mi", "ten", "ra", "so", "vel", "dun", "pi", "gor", "ae", "shi", "wen", "tor",
              "bel", "qua", "nim", "ost", "ri", "fa", "zu", "len", "dro", "mar", "ix", "el", "ban", "cy"]
COMMON = ["the", "of", "and", "a", "to", "in", "is", "that", "for", "on", "with", "as", "was", "by"]


def random_text(rng, n_words):
    words = []
    for _ in range(n_words):
        if rng.random() < 0.35:
            words.append(rng.choice(COMMON))
        else:
            words.append("".join(rng.choice(WORD_PARTS) for _ in range(rng.randint(1, 3))))
        if rng.random() < 0.08:
            words[-1] += rng.choice([".", ",", ";"])
    return " ".join(words)


class Prompts:
    """Distinct prompts of exact token counts, as token ids (with the model's BOS, from /tokenize)."""

    def __init__(self, node, seed):
        self.node = node
        self.rng = random.Random(seed)
        self.serial = 0
        self.words_per_token = 0.7

    def make(self, n_tokens):
        self.serial += 1
        # Random from the first token on: a prefix cache could reuse nothing past the BOS.
        tag = f"{self.rng.getrandbits(48):012x} record {self.serial}:"
        n_words = int(n_tokens * self.words_per_token) + 16
        for _ in range(6):
            text = tag + " " + random_text(self.rng, n_words)
            status, body = self.node.request("POST", "/tokenize", {"content": text, "add_special": True})
            if status != 200:
                raise RuntimeError(f"/tokenize gave {status}: {body[:300]}")
            ids = json.loads(body)["tokens"]
            if len(ids) >= n_tokens:
                self.words_per_token = max(0.1, n_words / len(ids))
                return ids[:n_tokens]
            n_words = int(n_words * n_tokens / max(1, len(ids)) * 1.1) + 16
        raise RuntimeError(f"could not make a prompt of {n_tokens} tokens")


PROMPT_LINE = re.compile(r"prompt (\d+) = (\d+) reused")


def time_first_token(node, ids, timeout):
    """A streamed completion of one token: (TTFT in seconds, the prompt line)."""
    body = json.dumps({"prompt": ids, "max_tokens": 1, "temperature": 0, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=timeout)
    try:
        conn.connect()
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"{node.name}: {r.status} {r.read()[:300]!r}")
        ttft = None
        line_text = r.headers.get("x-tandem-prompt", "")
        while True:
            raw = r.readline()
            if not raw:
                break
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(f"{node.name}: {event['error']}")
            choice = (event.get("choices") or [{}])[0]
            if ttft is None and (choice.get("text") or choice.get("finish_reason")):
                ttft = time.perf_counter() - t0
            cache = (event.get("tandem") or {}).get("prompt_cache")
            if cache:
                line_text = cache
        if ttft is None:
            raise RuntimeError(f"{node.name}: the stream ended without a token")
        return ttft, line_text
    finally:
        conn.close()


def schedule(arms, need):
    """A B C C B A A B C ... , an arm left out once it has its `need[arm]` samples."""
    order, k, count = [], 0, {a: 0 for a in arms}
    while any(count[a] < need[a] for a in arms):
        for a in arms if k % 2 == 0 else arms[::-1]:
            if count[a] < need[a]:
                order.append(a)
                count[a] += 1
        k += 1
    return order


def fmt_s(v):
    return "-" if v is None else f"{v:.3f}"


def bench_model(name, path, opts, log_dir, deadline_at):
    log(f"model {name}: {path}")
    max_len = max(opts.lengths)
    ctx = max_len + 64
    common = ["-m", path, "--ctx", str(ctx), "--kv-budget", opts.kv_budget]
    cpu = ["--device", "cpu", "-t", str(opts.threads)] + shlex.split(opts.cpu_args)
    nodes = {"local": Node(f"{name}-local", opts.tandem, common + cpu + ["--role", "both"], log_dir)}
    prefill_args = ["--role", "prefill", "--device", opts.device] + shlex.split(opts.prefill_args)
    if opts.device == "cpu":
        prefill_args += ["-t", str(opts.threads)]
    for rate in opts.rates:
        cap = [] if rate == "none" else ["--kv-send-rate", rate]
        p = Node(f"{name}-prefill-{rate}", opts.tandem, common + prefill_args + cap, log_dir)
        nodes[f"prefill-{rate}"] = p
    # A decode node asks its peer nothing before its first long prompt: all start at once.
    for rate in opts.rates:
        peer = nodes[f"prefill-{rate}"].url()
        args = common + cpu + ["--role", "decode", "--prefill-peer", peer,
                               "--remote-prefill-min-tokens", "32",
                               "--prefill-timeout", str(opts.request_timeout)]
        nodes[f"remote-{rate}"] = Node(f"{name}-decode-{rate}", opts.tandem, args, log_dir)
    start = time.monotonic()
    wait_up(list(nodes.values()), opts.startup_timeout)
    log(f"  {len(nodes)} servers up in {time.monotonic() - start:.1f} s (context {ctx})")

    prompts = Prompts(nodes["local"], seed=opts.seed)
    arms = ["local"] + [f"remote-{r}" for r in opts.rates]
    # One short request on every arm first: page-in, allocator, the GPU's first kernels.
    for arm in arms:
        ttft, line = time_first_token(nodes[arm], prompts.make(min(opts.lengths + [512])), opts.request_timeout)
        log(f"  warm-up {arm}: {ttft:.3f} s ({line})")

    results = []
    took = {}  # length: (seconds of one local sample, seconds of all the remote samples)
    for L in sorted(opts.lengths):
        long = opts.long_from and L >= opts.long_from
        need = {a: opts.discard + opts.reps for a in arms}
        drop = {a: opts.discard for a in arms}
        if long:
            need["local"], drop["local"] = opts.long_local_reps, 0
        if took:
            guess = guess_seconds(took, L, need["local"])
            left = deadline_at - time.monotonic()
            if guess > left:
                log(f"  skipping {L} tokens and longer: about {guess:.0f} s needed, {left:.0f} s left")
                SKIPPED.extend(f"{name} {n}" for n in sorted(opts.lengths) if n >= L)
                break
        order = schedule(arms, need)
        log(f"  {L} tokens: order " + " ".join(a.replace("remote-", "R:") for a in order)
            + f"; the first {opts.discard} of each arm thrown away"
            + (f" (local: {need['local']} sample(s), none thrown away: the process is warm)" if long else ""))
        samples = {a: [] for a in arms}
        kv_bytes = {}
        t_length = time.monotonic()
        for arm in order:
            node = nodes[arm]
            ids = prompts.make(L)
            before = node.metrics() if arm != "local" else None
            peer = nodes["prefill-" + arm[len("remote-"):]] if arm != "local" else None
            peer_before = peer.metrics() if peer else None
            ttft, line = time_first_token(node, ids, opts.request_timeout)
            m = PROMPT_LINE.search(line)
            problems = []
            if not m or int(m.group(1)) != L:
                problems.append(f"prompt line {line!r} is not for {L} tokens")
            elif int(m.group(2)) != 0:
                problems.append(f"prefix reuse: {line!r}")
            sample = {"ttft_s": ttft, "prompt_line": line}
            if arm == "local":
                if "remote" in line:
                    problems.append(f"local server went remote: {line!r}")
            else:
                after = node.metrics()
                peer_after = peer.metrics()
                d = lambda k, a=after, b=before: a.get(k, 0) - b.get(k, 0)
                fallbacks = sum(v - before.get(k, 0) for k, v in after.items()
                                if k.startswith("tandem_remote_prefill_fallback_total"))
                got = d("tandem_kv_received_bytes_total")
                sent = peer_after.get("tandem_kv_sent_bytes_total", 0) - peer_before.get("tandem_kv_sent_bytes_total", 0)
                if "(remote prefill)" not in line or d("tandem_remote_prefill_total") != 1 or fallbacks:
                    problems.append(f"not remote: {line!r}, remote +{d('tandem_remote_prefill_total'):.0f}, "
                                    f"fallbacks +{fallbacks:.0f}")
                if got != sent:
                    problems.append(f"received {got:.0f} bytes, the prefill node sent {sent:.0f}")
                sample["kv_bytes"] = got
                kv_bytes.setdefault(arm, []).append(got)
            sample["problems"] = problems
            if problems:
                PROBLEMS.append(f"{name} {L} {arm}: {'; '.join(problems)}")
            samples[arm].append(sample)
            warm = len(samples[arm]) > drop[arm]
            note = "" if warm else " (discarded)"
            extra = f", {sample['kv_bytes'] / L:.0f} KV B/token" if "kv_bytes" in sample else ""
            log(f"    {arm:>14}: {ttft:8.3f} s{extra}{note}" + (f"  PROBLEM: {'; '.join(problems)}" if problems else ""))
        local_warm = [s["ttft_s"] for s in samples["local"][drop["local"]:] if not s["problems"]]
        local_med = statistics.median(local_warm) if local_warm else None
        local_one = max(s["ttft_s"] for s in samples["local"])
        took[L] = (local_one, time.monotonic() - t_length - local_one * len(samples["local"]))
        for rate in opts.rates:
            arm = f"remote-{rate}"
            warm = [s["ttft_s"] for s in samples[arm][drop[arm]:] if not s["problems"]]
            med = statistics.median(warm) if warm else None
            kb = kv_bytes.get(arm) or []
            row = {
                "model": name, "prompt_tokens": L, "rate": rate,
                "local_median_s": local_med, "remote_median_s": med,
                "speedup": (local_med / med) if (local_med and med) else None,
                "kv_bytes_per_token": (statistics.median(kb) / L) if kb else None,
                "local_samples": samples["local"], "remote_samples": samples[arm],
            }
            results.append(row)
            log(f"  {L} tokens, {rate}: local {fmt_s(local_med)} s, remote {fmt_s(med)} s, "
                f"x{row['speedup']:.2f}" if row["speedup"] else f"  {L} tokens, {rate}: incomplete")
    for n in nodes.values():
        n.proc.send_signal(signal.SIGTERM)
    for n in nodes.values():
        try:
            n.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(n.proc.pid, signal.SIGKILL)
    return results


def guess_seconds(took, L, n_local):
    """What a length will take, from the lengths done: local prefill grows as a power of the length
    (measured between the last two lengths, else 1.7: between linear and attention's square), the remote
    arms about linearly (the wire and the KV grow linearly; the GPU's prefill is a small part)."""
    done = sorted(took)
    last = done[-1]
    power = 1.7
    if len(done) >= 2 and took[done[-2]][0] > 0:
        power = math.log(took[last][0] / took[done[-2]][0]) / math.log(last / done[-2])
        power = min(2.0, max(1.0, power))
    r = L / last
    return took[last][0] * r**power * n_local + took[last][1] * r**1.2


def crossover(rows, model, rate):
    """The smallest tested length from which on remote beats local at every longer tested length too
    (a single noisy win below a loss does not count): (length or None, text for the table)."""
    mine = sorted((r for r in rows if r["model"] == model and r["rate"] == rate), key=lambda r: r["prompt_tokens"])
    if not mine:
        return None, "-"
    first = None
    for r in reversed(mine):
        if not (r["speedup"] and r["speedup"] > 1):
            break
        first = r["prompt_tokens"]
    if first is None:
        return None, f"> {mine[-1]['prompt_tokens']}"
    return first, (f"<= {first}" if first == mine[0]["prompt_tokens"] else str(first))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--tandem", required=True, help="the tandem release binary")
    ap.add_argument("--model", action="append", required=True, metavar="NAME=PATH",
                    help="a GGUF file and the name the table gives it (repeatable)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="where the prefill node runs")
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 32768], help="prompt tokens")
    ap.add_argument("--rates", nargs="+", default=["none,10gbit,1gbit"],
                    help="the prefill node's --kv-send-rate per remote arm; none: no cap (comma or space separated)")
    ap.add_argument("--reps", type=int, default=2, help="warm samples per arm and length")
    ap.add_argument("--discard", type=int, default=1, help="first samples per arm and length thrown away")
    ap.add_argument("--long-from", type=int, default=16384,
                    help="from this prompt length on, the local arm (minutes of CPU prefill) takes "
                         "--long-local-reps samples and throws none away: its process is warm by then (0: off)")
    ap.add_argument("--long-local-reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads of the CPU nodes")
    ap.add_argument("--kv-budget", default="8G", help="--kv-budget of every node")
    ap.add_argument("--prefill-args", default="", help="more arguments for the prefill nodes")
    ap.add_argument("--cpu-args", default="", help="more arguments for the local and decode nodes")
    ap.add_argument("--deadline", type=float, default=0,
                    help="seconds for the whole run: a length that looks like it would overrun its model's "
                         "share is skipped (0: no deadline)")
    ap.add_argument("--startup-timeout", type=float, default=180)
    ap.add_argument("--request-timeout", type=float, default=600)
    ap.add_argument("--seed", type=int, default=48)
    ap.add_argument("--log-dir", default=None, help="the servers' logs (default: a new temporary folder)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    opts = ap.parse_args()
    opts.rates = [r.strip().lower() for arg in opts.rates for r in arg.split(",") if r.strip()]
    models = []
    for m in opts.model:
        name, sep, path = m.partition("=")
        if not sep or not name or not path:
            ap.error(f"--model {m!r}: NAME=PATH")
        path = os.path.expanduser(path)
        if not os.path.isfile(path):
            ap.error(f"--model {m!r}: no file {path}")
        models.append((name, path))
    if not os.access(opts.tandem, os.X_OK):
        ap.error(f"--tandem {opts.tandem}: not an executable")
    if opts.reps < 1 or opts.discard < 0:
        ap.error("--reps must be 1 or more, --discard 0 or more")

    atexit.register(kill_children)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log_dir = opts.log_dir or tempfile.mkdtemp(prefix="ttft-bench-")
    os.makedirs(log_dir, exist_ok=True)
    log(f"tandem {opts.tandem}, prefill on {opts.device}, CPU nodes {opts.threads} threads, "
        f"lengths {opts.lengths}, rates {opts.rates}, {opts.reps} warm + {opts.discard} discarded per arm; "
        f"logs in {log_dir}")

    rows = []
    for i, (name, path) in enumerate(models):
        if opts.deadline > 0:
            left = opts.deadline - (time.monotonic() - T0)
            deadline_at = time.monotonic() + left / (len(models) - i)
        else:
            deadline_at = float("inf")
        try:
            rows += bench_model(name, path, opts, log_dir, deadline_at)
        finally:
            kill_children()

    cross = {}
    for name, _ in models:
        for rate in opts.rates:
            cross[f"{name} {rate}"] = crossover(rows, name, rate)
    record = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "tandem": os.path.abspath(opts.tandem),
        "prefill_device": opts.device,
        "cpu_threads": opts.threads,
        "ttft": "client-side: streamed POST /v1/completions (token ids, max_tokens 1) to the first SSE "
                "event carrying the token",
        "options": {k: v for k, v in vars(opts).items()},
        "models": [{"name": n, "path": p} for n, p in models],
        "rows": rows,
        "crossover": {k: {"length": v[0], "text": v[1]} for k, v in cross.items()},
        "skipped": SKIPPED,
        "problems": PROBLEMS,
        "elapsed_s": time.monotonic() - T0,
    }
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump(record, f, indent=1)
        log(f"wrote {opts.out}")

    print()
    head = ["model", "prompt", "rate cap", "local s", "remote s", "local/remote", "KV B/token", "crossover"]
    table = [head]
    for r in rows:
        table.append([
            r["model"], str(r["prompt_tokens"]), r["rate"], fmt_s(r["local_median_s"]), fmt_s(r["remote_median_s"]),
            "-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
            "-" if r["kv_bytes_per_token"] is None else f"{r['kv_bytes_per_token']:.0f}",
            cross[f"{r['model']} {r['rate']}"][1],
        ])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for j, row in enumerate(table):
        print("  ".join(c.rjust(w) if i > 0 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if j == 0:
            print("  ".join("-" * w for w in widths))
    long = f"; from {opts.long_from} tokens on the local arm {opts.long_local_reps}, none thrown away" \
        if opts.long_from else ""
    print(f"\nTTFT: streamed completion (token ids, max_tokens 1) to its first token, as the client saw it; "
          f"medians of warm samples ({opts.reps} per arm and length, the first {opts.discard} thrown away{long}). "
          f"Prefill node on {opts.device}; local and decode nodes on the CPU ({opts.threads} threads). "
          f"KV B/token: the stream's bytes on the wire over the prompt's tokens. Crossover: the shortest "
          f"tested length from which on remote beats local. {time.monotonic() - T0:.0f} s in all.", flush=True)
    if SKIPPED:
        print("Skipped for the deadline: " + ", ".join(SKIPPED))
    if PROBLEMS:
        print(f"{len(PROBLEMS)} samples had problems; they are left out of the medians:")
        for p in PROBLEMS:
            print("  " + p)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
