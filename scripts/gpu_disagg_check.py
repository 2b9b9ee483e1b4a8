#!/usr/bin/env python3
"""Same-bits checks of disaggregated prefill on the GPU (issue 48), on loopback.

Setup a, GPU to GPU, bits: a prefill node and a decode node, both `--device cuda --deterministic`,
and a local server `--device cuda --deterministic`. Every prompt's greedy completion, with its top-2
logprobs, must be identical (tokens and logprob bits) from the decode node and from the local server.

Setup b, GPU prefill to CPU decode, tokens: a prefill node `--device cuda` (not deterministic: the
route a production prefill node takes) and a decode node on the CPU, against a local CPU server. The
GPU's KV differs from the CPU's in its last bits, so the tokens may part where the model hesitates:
position by position, the decode node's greedy token must equal the local one wherever the local
top-1 margin (top-1 logprob minus top-2 logprob) is at least `--margin` (0.4). At the first position
where they differ the prompt passes only if the local margin there is below it, and the comparison
of that prompt stops there (what follows continues different texts).

Prompts (token ids, the model's BOS first, from the server's /tokenize): a list of priced items, so
that the model predicts its continuation with confidence. Per model: `--lengths` fresh prompts
(default 1100, 1600, 2600 tokens: past Gemma 3's 512-row window and 768-row ring), then a conversation:
the first length, continued by its own completion and `--continue` more tokens per turn (default
1200, past a ring, then 200, within one), so the decode node reuses its conversation and the peer
ships only the new rows. Every decode-node answer must say `(remote prefill)` (no fallback), and a
continued turn must say it reused a prefix; else the check would compare a local read with itself.

On the GPU machine (python3, the binary at .gpu/tandem, the models' files; no network):
  python3 scripts/gpu_disagg_check.py --tandem .gpu/tandem \\
      --model gemma3-270m=/path/gemma-3-270m-q4_k_m.gguf --model smollm2-135m=/path/SmolLM2.gguf \\
      --log-dir $OUT/logs
CPU only, short (every node on the CPU; what was run before the script went to the GPU):
  python3 scripts/gpu_disagg_check.py --tandem target/release/tandem --prefill-device cpu \\
      --setup-a-device cpu --model gemma3-270m=~/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf \\
      --model smollm2-135m=~/.cache/tandem/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --lengths 300 --continue 100 40 --max-tokens 6 --threads 2

Prints a markdown table (model, setup, prompt tokens, tokens compared, result) last; exits 1 when a
check failed, 2 when one could not run. Only the Python standard library is used; the server helpers
are scripts/ttft_bench.py's. Children are killed at exit.
"""

import argparse
import atexit
import json
import os
import re
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ttft_bench as tb  # noqa: E402  (the servers' helpers: Node, wait_up, kill_children)

log = tb.log
PROMPT_LINE = re.compile(r"prompt (\d+) = (\d+) reused")


def tokenize(node, text, special):
    status, body = node.request("POST", "/tokenize", {"content": text, "add_special": special})
    if status != 200:
        raise RuntimeError(f"{node.name}: /tokenize gave {status}: {body[:300]}")
    return json.loads(body)["tokens"]


def items_text(first, n, seed):
    return " ".join(f"item{i} costs {(i * 7 + seed) % 97} coins." for i in range(first, first + n))


def item_ids(node, n_tokens, seed, special, first_item=0):
    """Exactly `n_tokens` ids of a priced-item list (with BOS when `special`)."""
    n_items = max(4, n_tokens // 6)
    for _ in range(6):
        ids = tokenize(node, items_text(first_item, n_items, seed), special)
        if len(ids) >= n_tokens:
            return ids[:n_tokens]
        n_items = int(n_items * n_tokens / max(1, len(ids)) * 1.2) + 4
    raise RuntimeError(f"could not make {n_tokens} tokens of items")


def complete(node, ids, opts):
    """Greedy completion with top-2 logprobs: (choice, prompt line)."""
    body = {"prompt": ids, "max_tokens": opts.max_tokens, "temperature": 0, "logprobs": 2}
    status, text = node.request("POST", "/v1/completions", body, timeout=opts.request_timeout)
    if status != 200:
        raise RuntimeError(f"{node.name}: {status}: {text[:300]}")
    v = json.loads(text)
    return v["choices"][0], (v.get("tandem") or {}).get("prompt_cache", "")


def remote_problem(line, n_prompt, continued):
    """Why a decode node's answer does not test a remote prefill (None: it does)."""
    m = PROMPT_LINE.search(line)
    if "(remote prefill)" not in line or not m or int(m.group(1)) != n_prompt:
        return f"not a remote prefill of {n_prompt} tokens: {line!r}"
    if continued and int(m.group(2)) == 0:
        return f"a continued turn reused nothing: {line!r}"
    return None


def margins(choice):
    """Per generated position: (token text, top-1 minus top-2 logprob; None when the two alternatives
    share a text and the map kept one)."""
    lp = choice.get("logprobs") or {}
    out = []
    for tok, top in zip(lp.get("tokens") or [], lp.get("top_logprobs") or []):
        vals = sorted(top.values(), reverse=True)
        out.append((tok, vals[0] - vals[1] if len(vals) >= 2 else None))
    return out


def compare_bits(want, got):
    """Setup a: (tokens compared, failure or None)."""
    n = len((want.get("logprobs") or {}).get("tokens") or [])
    if got == want:
        return n, None
    a, b = margins(want), margins(got)
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x[0] != y[0]), None)
    where = f"token {at}" if at is not None else "logprob bits (same tokens)"
    return n, f"differs from local: {where}"


def compare_tokens(want, got, threshold):
    """Setup b: (tokens compared, failure or None, note)."""
    a, b = margins(want), margins(got)
    if len(a) != len(b) and all(x[0] == y[0] for x, y in zip(a, b)):
        return min(len(a), len(b)), f"{len(b)} tokens against {len(a)} local", ""
    for i, ((tok_a, margin), (tok_b, _)) in enumerate(zip(a, b)):
        if tok_a == tok_b:
            continue
        shown = "?" if margin is None else f"{margin:.3f}"
        if margin is not None and margin < threshold:
            return i + 1, None, f"parted at {i}, local margin {shown} < {threshold}"
        return i + 1, f"token {i}: {tok_b!r} against local {tok_a!r}, local margin {shown}", ""
    return len(a), None, ""


def run_setup(name, path, setup, opts, log_dir, rows):
    turns = opts.lengths[0] + sum(opts.cont) + len(opts.cont) * (2 * opts.max_tokens + 8)
    ctx = max(max(opts.lengths), turns) + opts.max_tokens + 64
    common = ["-m", path, "--ctx", str(ctx), "--kv-budget", opts.kv_budget]
    cpu = ["--device", "cpu", "-t", str(opts.threads)]
    if setup == "a":
        dev = ["--device", opts.setup_a_device, "--deterministic"]
        dev += ["--gpu", str(opts.gpu)] if opts.setup_a_device == "cuda" else ["-t", str(opts.threads)]
        prefill_dev, decode_dev, local_dev = dev, dev, dev
    else:
        prefill_dev = ["--device", opts.prefill_device]
        prefill_dev += ["--gpu", str(opts.gpu)] if opts.prefill_device == "cuda" else ["-t", str(opts.threads)]
        decode_dev, local_dev = cpu, cpu
    prefill = tb.Node(f"{name}-{setup}-prefill", opts.tandem, common + prefill_dev + ["--role", "prefill"], log_dir)
    decode = tb.Node(f"{name}-{setup}-decode", opts.tandem,
                     common + decode_dev + ["--role", "decode", "--prefill-peer", prefill.url(),
                                            "--remote-prefill-min-tokens", "32",
                                            "--prefill-timeout", str(opts.request_timeout)], log_dir)
    local = tb.Node(f"{name}-{setup}-local", opts.tandem, common + local_dev, log_dir)
    nodes = [prefill, decode, local]
    try:
        tb.wait_up(nodes, opts.startup_timeout)
        # (label, ids, turn): the fresh prompts, then the conversation's first turn; each of its turns
        # adds the next (this prompt, its answer, `--continue` more tokens) once answered.
        work = [(f"fresh {n}", item_ids(local, n, seed=11 + k, special=True), 0)
                for k, n in enumerate(opts.lengths)]
        work.append(("conversation 1", item_ids(local, opts.lengths[0], seed=5, special=True), 0))
        i = 0
        while i < len(work):
            label, ids, turn = work[i]
            i += 1
            want, _ = complete(local, ids, opts)
            got, line = complete(decode, ids, opts)
            problem = remote_problem(line, len(ids), turn > 0)
            if problem:
                compared, failure, note = 0, problem, ""
            elif setup == "a":
                compared, failure = compare_bits(want, got)
                note = "same tokens and logprob bits"
            else:
                compared, failure, note = compare_tokens(want, got, opts.margin)
                note = note or "same tokens"
            result = f"FAIL: {failure}" if failure else f"ok: {note}"
            log(f"  {setup} {label} ({len(ids)} tokens; {line}): {result}")
            rows.append({"model": name, "setup": setup, "prompt": label, "prompt_tokens": len(ids),
                         "compared": compared, "result": result, "failed": failure is not None})
            if label.startswith("conversation") and turn < len(opts.cont):
                answer = tokenize(local, want.get("text", ""), special=False)
                more = item_ids(local, opts.cont[turn], seed=17 + turn, special=False, first_item=100 * (turn + 1))
                work.append((f"conversation {turn + 2}", ids + answer + more, turn + 1))
    finally:
        for n in nodes:
            n.proc.send_signal(signal.SIGTERM)
        tb.kill_children()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--tandem", default=".gpu/tandem", help="the tandem binary")
    ap.add_argument("--model", action="append", required=True, metavar="NAME=PATH",
                    help="a GGUF file and the name the table gives it (repeatable)")
    ap.add_argument("--setups", default="a,b", help="which checks: a (GPU to GPU, bits), b (GPU to CPU, tokens)")
    ap.add_argument("--prefill-device", choices=["cuda", "cpu"], default="cuda",
                    help="setup b's prefill node (cpu: to try the script without a GPU)")
    ap.add_argument("--setup-a-device", choices=["cuda", "cpu"], default="cuda",
                    help="setup a's three nodes (cpu: to try the script without a GPU)")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--lengths", type=int, nargs="+", default=[1100, 1600, 2600], help="fresh prompts' tokens")
    ap.add_argument("--continue", dest="cont", type=int, nargs="*", default=[1200, 200],
                    help="tokens each continued turn adds after the last answer")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--margin", type=float, default=0.4, help="setup b: the local top-1 margin that must hold")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads of the CPU nodes")
    ap.add_argument("--kv-budget", default="4G", help="--kv-budget of every node")
    ap.add_argument("--startup-timeout", type=float, default=300)
    ap.add_argument("--request-timeout", type=float, default=600)
    ap.add_argument("--log-dir", default=None, help="the servers' logs (default: a new temporary folder)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    opts = ap.parse_args()
    setups = [s.strip() for s in opts.setups.split(",") if s.strip()]
    if not setups or any(s not in ("a", "b") for s in setups):
        ap.error(f"--setups {opts.setups!r}: a, b or a,b")
    if min(opts.lengths) < 64 or any(c < 40 for c in opts.cont) or opts.max_tokens < 1:
        ap.error("--lengths of 64 tokens or more, --continue of 40 or more (the decode node sends 32 new "
                 "tokens or more to its peer), --max-tokens of 1 or more")
    models = []
    for m in opts.model:
        name, sep, path = m.partition("=")
        path = os.path.expanduser(path)
        if not sep or not name or not os.path.isfile(path):
            ap.error(f"--model {m!r}: NAME=PATH of a file")
        models.append((name, path))
    if not os.access(opts.tandem, os.X_OK):
        ap.error(f"--tandem {opts.tandem}: not an executable")

    atexit.register(tb.kill_children)
    signal.signal(signal.SIGTERM, tb.on_signal)
    signal.signal(signal.SIGINT, tb.on_signal)
    log_dir = opts.log_dir or tempfile.mkdtemp(prefix="gpu-disagg-check-")
    os.makedirs(log_dir, exist_ok=True)
    log(f"tandem {opts.tandem}; setups {setups}; setup b's prefill on {opts.prefill_device}; logs in {log_dir}")

    rows, errors = [], []
    for name, path in models:
        for setup in setups:
            log(f"{name}, setup {setup}")
            try:
                run_setup(name, path, setup, opts, log_dir, rows)
            except (RuntimeError, OSError, ValueError, KeyError) as e:
                errors.append(f"{name} setup {setup}: {e}")
                log(f"  could not run: {e}")
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump({"options": vars(opts), "rows": rows, "errors": errors}, f, indent=1)

    failed = [r for r in rows if r["failed"]]
    print()
    for e in errors:
        print(f"ERROR {e}")
    labels = {"a": f"{opts.setup_a_device.upper()} to {opts.setup_a_device.upper()}, deterministic: bits",
              "b": f"{opts.prefill_device.upper()} prefill to CPU: tokens where margin >= {opts.margin}"}
    print("| model | setup | prompt tokens | tokens compared | result |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {labels[r['setup']]} ({r['prompt']}) | {r['prompt_tokens']} | "
              f"{r['compared']} | {r['result']} |")
    if errors:
        return 2
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
