"""Print benchmark results as ratios against the baseline measured in the same run.

`make bench` runs pytest-benchmark with --benchmark-json=.benchmarks/last.json, then this.  In each
benchmark group the entry whose name contains "baseline" is the reference; every other entry is
shown as ops/s and as a multiple of the baseline (>1 = faster than the baseline) - in records/s
when both report `records_per_s`, else in rounds/s.  Benchmarks
may attach figures of their own (records/s, MB/s, p99...) through `benchmark.extra_info`.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict

DEFAULT = ".benchmarks/last.json"


def main(path: str = DEFAULT) -> int:
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        print(f"no benchmark results at {path}; run `make bench`", file=sys.stderr)
        return 1
    groups = defaultdict(list)
    for b in data["benchmarks"]:
        groups[b.get("group") or "(ungrouped)"].append(b)
    width = max((len(b["name"]) for bs in groups.values() for b in bs), default=20) + 2
    for group, benches in sorted(groups.items()):
        base = next((b for b in benches if "baseline" in b["name"]), None)
        print(f"\n== {group}" + (f"  (baseline: {base['name']})" if base else ""))
        print(f"{'benchmark':<{width}} {'ops/s':>14} {'median':>12} {'vs baseline':>12}  extra")
        for b in sorted(benches, key=lambda b: b["name"]):
            ops = b["stats"]["ops"]
            med = b["stats"]["median"]
            ratio = f"{_ratio(b, base):.2f}x" if base and b is not base else ("1.00x" if b is base else "-")
            extra = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted((b.get("extra_info") or {}).items()))
            print(f"{b['name']:<{width}} {ops:>14,.1f} {_fmt_time(med):>12} {ratio:>12}  {extra}")
    return 0


def _ratio(b, base) -> float:
    """b's rate over the baseline's: in records/s when both report them (a round of b may put
    many records, one of the baseline's one), else in rounds/s."""
    mine, theirs = ((x.get("extra_info") or {}).get("records_per_s") for x in (b, base))
    if mine and theirs:
        return mine / theirs
    return b["stats"]["ops"] / base["stats"]["ops"]


def _fmt(v):
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) < 1e6 else f"{v:,.0f}"
    return str(v)


def _fmt_time(s: float) -> str:
    for unit, mul in (("s", 1), ("ms", 1e3), ("us", 1e6), ("ns", 1e9)):
        if s * mul >= 1:
            return f"{s * mul:.2f}{unit}"
    return f"{s * 1e9:.2f}ns"


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
