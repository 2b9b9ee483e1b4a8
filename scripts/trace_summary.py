#!/usr/bin/env python3
"""Summarizes a kernel timeline written by `TANDEM_CUDA_TRACE=path` (crates/tandem-cuda/src/trace.rs).

Each line is one launch as its block (0, 0, 0) saw it: the global clock when it reached its
WAIT_PRIOR_GRID() and when the wait released it. A launch's wait is released once the launch before it
has finished, so the gap from one release to the next is what a kernel cost inside the replayed graph
(its own work plus the hand-over to the next). Gaps longer than --gap-us are time between passes (the
host, a synchronization), not a kernel's, and are left out.

    python3 scripts/trace_summary.py trace.tsv                 # the last 250 ms of the run
    python3 scripts/trace_summary.py trace.tsv --window-ms 100 --gap-us 50
    python3 scripts/trace_summary.py trace.tsv --sequence 24   # also the pass's first 24 launches

A replayed decode graph launches the same kernels in the same order every pass, so `--sequence N`
lines the passes up and prints, for each of the first N launches of a pass, the kernel and the median
of its cost across the passes (a layer's walk: norm, projections, attention, ...).
"""
import argparse
import collections
import sys


def load(path):
    rows = []
    with open(path) as f:
        header = f.readline().rstrip("\n").split("\t")
        for line in f:
            v = dict(zip(header, line.rstrip("\n").split("\t")))
            rows.append((int(v["arrived_ns"]), int(v["released_ns"]), v["kernel"],
                         f'{v["grid_x"]}x{v["grid_y"]}x{v["grid_z"]}'))
    rows.sort(key=lambda r: (r[1], r[0]))
    return rows


def split_passes(rows, window_ms, gap_us):
    """The launches released in the last `window_ms`, split into passes at gaps longer than `gap_us`:
    each pass a list of (kernel, grid, cost in ns, waited in ns), the last pass still open; also the
    gaps' total (ns) and the number of launches in the window."""
    end = rows[-1][1]
    rows = [r for r in rows if r[1] >= end - window_ms * 1e6]
    passes, gap_ns = [[]], 0
    for a, b in zip(rows, rows[1:]):
        span = b[1] - a[1]
        if span > gap_us * 1e3:
            passes.append([])
            gap_ns += span
        else:
            passes[-1].append((a[2], a[3], span, a[1] - a[0]))
    return passes, gap_ns, len(rows)


def summarize(rows, window_ms, gap_us):
    if len(rows) < 2:
        return None
    passes, gap_ns, n = split_passes(rows, window_ms, gap_us)
    spans = collections.defaultdict(list)
    waits = collections.defaultdict(list)
    busy_ns = 0
    for name, grid, span, waited in (launch for p in passes for launch in p):
        spans[(name, grid)].append(span)
        waits[(name, grid)].append(waited)
        busy_ns += span
    return spans, waits, len(passes), gap_ns, busy_ns, n


def sequence(rows, window_ms, gap_us, count):
    """The first `count` launches of the whole passes in the window: (kernel, grid, median cost in
    ns, passes seen), position by position."""
    passes = split_passes(rows, window_ms, gap_us)[0][:-1]  # the last one has no gap after it yet
    # The first pass may start inside the window's edge: keep passes of the most common length.
    lengths = collections.Counter(len(p) for p in passes[1:] or passes)
    if not lengths:
        return []
    full = lengths.most_common(1)[0][0]
    whole = [p for p in passes if len(p) == full]
    out = []
    for i in range(min(count, full)):
        costs = sorted(p[i][2] for p in whole)
        out.append((whole[0][i][0], whole[0][i][1], costs[len(costs) // 2], len(costs)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--window-ms", type=float, default=250.0)
    ap.add_argument("--gap-us", type=float, default=100.0)
    ap.add_argument("--sequence", type=int, default=0, metavar="N")
    args = ap.parse_args()
    rows = load(args.trace)
    got = summarize(rows, args.window_ms, args.gap_us)
    if got is None:
        sys.exit("fewer than two launches in the trace")
    spans, waits, passes, gap_ns, busy_ns, n = got
    print(f"{n} launches in the last {args.window_ms:g} ms: {passes} passes, "
          f"{busy_ns / passes / 1e3:.1f} us of kernels a pass, {gap_ns / max(passes - 1, 1) / 1e3:.1f} us "
          f"between passes")
    print()
    print("| kernel | grid | launches a pass | us each (median) | us a pass | share | waited us (median) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    order = sorted(spans, key=lambda k: -sum(spans[k]))
    for k in order:
        s = sorted(spans[k])
        w = sorted(waits[k])
        total = sum(s)
        print(f"| {k[0]} | {k[1]} | {len(s) / passes:.1f} | {s[len(s) // 2] / 1e3:.2f} | "
              f"{total / passes / 1e3:.1f} | {100 * total / busy_ns:.1f}% | {w[len(w) // 2] / 1e3:.2f} |")
    if args.sequence > 0:
        seq = sequence(rows, args.window_ms, args.gap_us, args.sequence)
        print()
        print("| launch in the pass | kernel | grid | us (median over passes) | passes |")
        print("|---:|---|---|---:|---:|")
        for i, (name, grid, cost, n) in enumerate(seq):
            print(f"| {i} | {name} | {grid} | {cost / 1e3:.2f} | {n} |")


if __name__ == "__main__":
    main()
