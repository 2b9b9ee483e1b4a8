#!/usr/bin/env python3
"""Summarizes an Nsight Compute source page (`--page source --csv --print-source sass`): the
instructions with the most warp stall samples, the share of each stall column, and the whole
listing with samples, in address order."""
import csv
import sys

rows = list(csv.reader(open(sys.argv[1], newline="")))
head_i = next(i for i, r in enumerate(rows) if any("Source" == c for c in r))
head, body = rows[head_i], [r for r in rows[head_i + 1:] if len(r) == len(rows[head_i])]
col = {name: i for i, name in enumerate(head)}
samp = next(i for i, n in enumerate(head) if n.startswith("Warp Stall Sampling (All"))


def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


total = sum(num(r[samp]) for r in body) or 1.0
print(f"{len(body)} instructions, {total:.0f} stall samples; columns: {len(head)}")
print("top instructions by samples:")
for r in sorted(body, key=lambda r: -num(r[samp]))[:24]:
    print(f"  {100 * num(r[samp]) / total:5.1f}%  {r[col.get('Address', 0)]}  {r[col['Source']][:90]}")
stall_cols = [i for i, n in enumerate(head) if "stall" in n.lower() and i != samp]
sums = sorted(((sum(num(r[i]) for r in body), head[i]) for i in stall_cols), reverse=True)
print("stall columns (sum over instructions):")
for s, n in sums[:16]:
    if s > 0:
        print(f"  {s:10.0f}  {n}")
print("listing (samples, address, sass):")
for r in body:
    print(f"{num(r[samp]):6.0f} {r[col.get('Address', 0)]} {r[col['Source']][:100]}")
