#!/usr/bin/env python3
"""Paired A/B runs of two commands: which is faster, by how much, and how sure.

    python3 scripts/ab.py --a 'tandem bench ... --expert-stream all' \\
        --b 'tandem bench ... --expert-stream routed' \\
        --metric 'prompt: ([0-9.,]+) tok/s' --pairs 4 --higher-is-better --json ab.json

Runs the commands (through the shell) in blocks of four, A B B A, then B A A B, and so on, so that a
drift of the machine over time (clocks, heat, caches) falls on both arms alike. Each block gives two
pairs, its first two runs and its last two. The metric is the first group of --metric in a run's stdout
(the last line that matches; a float, commas allowed). Each pair's ratio is B over A when higher is
better and A over B when lower is better, so a ratio above 1 always means B did better. The result is
the median of the pair ratios and a percentile bootstrap 95% interval of that median (--resamples
resamples of the pairs, seeded). --warmup runs each command that many times first, unmeasured.

Exit status: 0 when every run succeeded and printed the metric, 1 when a run failed or its metric is
missing, 2 for bad arguments. `--self-test` checks the run order, the pairing, the metric parsing and
the bootstrap on synthetic numbers, without running anything.
"""
import argparse
import json
import math
import random
import re
import statistics
import subprocess
import sys
import time

BLOCKS = ("ABBA", "BAAB")


def schedule(pairs):
    """The arms in run order ("A"/"B" per run) and each pair as (index of its A run, index of its B run).
    Blocks alternate A B B A and B A A B; an odd last pair takes the first half of its block."""
    order, pair_runs = [], []
    block = 0
    while len(pair_runs) < pairs:
        pattern = BLOCKS[block % 2]
        if pairs - len(pair_runs) < 2:
            pattern = pattern[:2]
        base = len(order)
        order.extend(pattern)
        for first in range(0, len(pattern), 2):
            i, j = base + first, base + first + 1
            pair_runs.append((i, j) if order[i] == "A" else (j, i))
        block += 1
    return order, pair_runs


def parse_metric(pattern, text):
    """The metric in `text`: the first group of `pattern`'s last match, commas dropped; None if absent."""
    matches = list(pattern.finditer(text))
    if not matches:
        return None
    raw = matches[-1].group(1)
    if raw is None:
        return None
    try:
        value = float(raw.replace(",", "").strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def pair_ratio(a, b, higher_is_better):
    """B's advantage over A as a ratio above 1 when B did better."""
    num, den = (b, a) if higher_is_better else (a, b)
    if den == 0:
        raise ValueError(f"a ratio with a zero denominator (A {a}, B {b})")
    return num / den


def percentile(sorted_values, q):
    """The q-quantile (0..1) of sorted values, interpolating between neighbours."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bootstrap_median_ci(ratios, resamples, seed, level=0.95):
    """A percentile bootstrap interval of the median of `ratios`: resample them with replacement,
    take each resample's median, and cut the tails of those medians."""
    rng = random.Random(seed)
    n = len(ratios)
    medians = sorted(statistics.median(rng.choices(ratios, k=n)) for _ in range(resamples))
    tail = (1 - level) / 2
    return percentile(medians, tail), percentile(medians, 1 - tail)


def summarize(values, pair_runs, higher_is_better, resamples, seed):
    """Pair ratios, their median and its bootstrap interval from the measured runs' values."""
    ratios = [pair_ratio(values[a], values[b], higher_is_better) for a, b in pair_runs]
    median = statistics.median(ratios)
    lo, hi = bootstrap_median_ci(ratios, resamples, seed)
    return ratios, median, (lo, hi)


def run_command(cmd):
    """Runs one command through the shell: (exit status, stdout, stderr, seconds)."""
    start = time.monotonic()
    p = subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       errors="replace")
    return p.returncode, p.stdout, p.stderr, time.monotonic() - start


def tail(text, lines=20):
    return "\n".join(text.rstrip("\n").split("\n")[-lines:])


def progress(line):
    print(line, file=sys.stderr, flush=True)


def measure(args, pattern, runner=run_command, log=progress):
    """Runs the warm-up and the paired schedule through `runner`; returns the report as a dict, or
    raises RuntimeError naming the run that failed or printed no metric."""
    cmds = {"A": args.a, "B": args.b}
    for w in range(args.warmup):
        for arm in "AB":
            status, out, err, secs = runner(cmds[arm])
            log(f"warm-up {w + 1} {arm}: exit {status} ({secs:.1f} s)")
            if status != 0:
                raise RuntimeError(f"warm-up run of {arm} failed (exit {status}):\n{tail(err or out)}")
    order, pair_runs = schedule(args.pairs)
    runs = []
    for i, arm in enumerate(order):
        status, out, err, secs = runner(cmds[arm])
        if status != 0:
            raise RuntimeError(f"run {i + 1} ({arm}) failed (exit {status}):\n{tail(err or out)}")
        value = parse_metric(pattern, out)
        if value is None:
            raise RuntimeError(f"run {i + 1} ({arm}) printed no metric matching {pattern.pattern!r}:\n{tail(out)}")
        log(f"run {i + 1}/{len(order)} {arm}: {value:g} ({secs:.1f} s)")
        runs.append({"run": i + 1, "arm": arm, "value": value, "seconds": round(secs, 3)})
    values = [r["value"] for r in runs]
    ratios, median, (lo, hi) = summarize(values, pair_runs, args.higher_is_better, args.resamples, args.seed)
    return {
        "a": args.a,
        "b": args.b,
        "metric": pattern.pattern,
        "better": "higher" if args.higher_is_better else "lower",
        "ratio": "B/A" if args.higher_is_better else "A/B",
        "runs": runs,
        "pairs": [{"a_run": a + 1, "b_run": b + 1, "a": values[a], "b": values[b], "ratio": r}
                  for (a, b), r in zip(pair_runs, ratios)],
        "median_ratio": median,
        "ci95": [lo, hi],
        "resamples": args.resamples,
        "seed": args.seed,
    }


def report_lines(report):
    lines = [f"metric {report['metric']!r}, {report['better']} is better; ratio {report['ratio']}, above 1: B better"]
    for r in report["runs"]:
        lines.append(f"  run {r['run']:>2} {r['arm']}: {r['value']:g}")
    for i, p in enumerate(report["pairs"]):
        lines.append(f"  pair {i + 1} (runs {p['a_run']} A, {p['b_run']} B): A {p['a']:g}, B {p['b']:g}, "
                     f"ratio {p['ratio']:.4f}")
    m, (lo, hi) = report["median_ratio"], report["ci95"]
    # B's metric against A's at the median ratio: a rate up by m - 1, a time down to 1 / m.
    change = (m - 1) if report["better"] == "higher" else (1 / m - 1)
    lines.append(f"median ratio {m:.4f} (B's metric {change * 100:+.1f}%), bootstrap 95% interval {lo:.4f} to "
                 f"{hi:.4f} ({report['resamples']} resamples, seed {report['seed']})")
    return lines


def self_test():
    """Checks the order, the pairing, the metric parsing and the bootstrap without running anything."""
    order, pairs = schedule(4)
    assert "".join(order) == "ABBABAAB", order
    assert pairs == [(0, 1), (3, 2), (5, 4), (6, 7)], pairs
    assert all(order[a] == "A" and order[b] == "B" for a, b in pairs)
    order, pairs = schedule(5)
    assert "".join(order) == "ABBABAABAB" and pairs[-1] == (8, 9), (order, pairs)
    order, pairs = schedule(6)
    assert "".join(order) == "ABBABAABABBA" and len(pairs) == 6
    for n in range(1, 12):
        order, pairs = schedule(n)
        used = sorted(i for p in pairs for i in p)
        assert len(pairs) == n and used == list(range(len(order))), n
        assert order.count("A") == order.count("B") == n

    metric = re.compile(r"prompt: ([-0-9.,eE+]+) tok/s")
    assert parse_metric(metric, "prompt: 1,234.5 tok/s\n") == 1234.5
    assert parse_metric(metric, "prompt: 10 tok/s\nprompt: 2.5e3 tok/s\n") == 2500.0
    assert parse_metric(metric, "decode: 5 tok/s\n") is None
    assert parse_metric(metric, "prompt: ,,, tok/s") is None
    assert parse_metric(re.compile(r"x=(\d+)?;"), "x=;") is None

    assert pair_ratio(100, 120, True) == 1.2
    assert pair_ratio(120, 100, False) == 1.2
    try:
        pair_ratio(0, 1, True)
        raise AssertionError("a zero denominator was accepted")
    except ValueError:
        pass

    # Four pair ratios with a known answer: the median is the mean of the middle two, and with four
    # ratios the 2.5% and 97.5% points of the resampled medians are the smallest and largest ratio.
    ratios = [1.224, 1.212, 1.209, 1.225]
    assert abs(statistics.median(ratios) - 1.218) < 1e-12
    lo, hi = bootstrap_median_ci(ratios, 20000, 1)
    assert (round(lo, 6), round(hi, 6)) == (1.209, 1.225), (lo, hi)
    assert bootstrap_median_ci(ratios, 2000, 7) == bootstrap_median_ci(ratios, 2000, 7)
    assert bootstrap_median_ci([1.05] * 6, 500, 3) == (1.05, 1.05)
    rng = random.Random(5)
    noisy = [1.1 + rng.gauss(0, 0.05) for _ in range(15)]
    lo, hi = bootstrap_median_ci(noisy, 5000, 2)
    assert min(noisy) <= lo <= statistics.median(noisy) <= hi <= max(noisy), (lo, hi)
    assert percentile([1.0, 2.0, 3.0], 0.5) == 2.0 and percentile([1.0, 3.0], 0.25) == 1.5

    # The whole schedule through a fake runner: B is 10% faster (lower seconds) and the machine drifts
    # 1% slower every run; the order cancels the drift, so every pair says 1.1 within the drift.
    class Args:
        a, b, pairs, warmup, higher_is_better, resamples, seed = "run-a", "run-b", 4, 1, False, 2000, 1
    calls = []

    def fake(cmd):
        calls.append(cmd)
        t = 100.0 * (1.01 ** len(calls)) / (1.1 if cmd == "run-b" else 1.0)
        return 0, f"noise\ntime: {t:,.3f} ms\n", "", 0.0

    report = measure(Args, re.compile(r"time: ([0-9.,]+) ms"), runner=fake, log=lambda _: None)
    assert calls[:2] == ["run-a", "run-b"], calls
    assert [c[-1].upper() for c in calls[2:]] == list("ABBABAAB"), calls
    assert all(abs(p["ratio"] - 1.1) < 0.025 for p in report["pairs"]), report["pairs"]
    assert 1.09 < report["median_ratio"] < 1.11 and report["ci95"][0] <= report["median_ratio"] <= report["ci95"][1]
    lines = report_lines(report)
    assert len(lines) == 1 + 8 + 4 + 1 and "metric -9." in lines[-1], lines[-1]
    json.dumps(report)

    def failing(cmd):
        return (1, "", "boom", 0.0) if cmd == "run-b" else (0, "time: 1 ms", "", 0.0)

    def silent(cmd):
        return 0, "nothing here", "", 0.0

    for runner, words in ((failing, "failed"), (silent, "no metric")):
        try:
            measure(Args, re.compile(r"time: ([0-9.,]+) ms"), runner=runner, log=lambda _: None)
            raise AssertionError(f"a run that {words} was accepted")
        except RuntimeError as e:
            assert words in str(e), e
    print("ab.py self-test: OK")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--a", help="command A (the baseline), run through the shell")
    ap.add_argument("--b", help="command B (the candidate)")
    ap.add_argument("--metric", help="regex whose first group is the metric in a run's stdout")
    ap.add_argument("--pairs", type=int, default=4, help="pairs of runs (default 4; fewer than 4 tell little)")
    better = ap.add_mutually_exclusive_group()
    better.add_argument("--higher-is-better", dest="higher_is_better", action="store_true", default=True,
                        help="the metric is a rate (the default): ratio B/A")
    better.add_argument("--lower-is-better", dest="higher_is_better", action="store_false",
                        help="the metric is a time: ratio A/B")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured runs of each command first (default 1)")
    ap.add_argument("--resamples", type=int, default=20000, help="bootstrap resamples (default 20000)")
    ap.add_argument("--seed", type=int, default=1, help="bootstrap seed (default 1)")
    ap.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    ap.add_argument("--self-test", action="store_true", help="check this script on synthetic numbers and exit")
    args = ap.parse_args()
    if args.self_test:
        self_test()
        return 0
    if not (args.a and args.b and args.metric):
        ap.error("--a, --b and --metric are required")
    if args.pairs < 1 or args.warmup < 0 or args.resamples < 1:
        ap.error("--pairs and --resamples must be at least 1, --warmup at least 0")
    try:
        pattern = re.compile(args.metric, re.M)
    except re.error as e:
        ap.error(f"--metric: {e}")
    if pattern.groups < 1:
        ap.error("--metric needs a group around the number, e.g. 'tok/s: ([0-9.,]+)'")
    if args.pairs < 4:
        print(f"note: {args.pairs} pairs; at least 4 are needed for an interval worth reading", file=sys.stderr)
    try:
        report = measure(args, pattern)
    except (RuntimeError, ValueError) as e:
        print(f"ab.py: {e}", file=sys.stderr)
        return 1
    for line in report_lines(report):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
