"""Benchmark this checkout against another commit in one run, and print before/after ratios.

    make bench-against REF=<commit> [BENCH_K='-k send'] [ROUNDS=2]

A git worktree of REF (`.benchmarks/against-<sha>`, set up once with its own `make build`, so
each tree runs with the plugins and extensions of its own commit) and this checkout take turns
file by file: before, after, before, after...  A row's figure is its best run, in records/s
where the benchmark reports them (rounds/s otherwise).  Both trees run their own bench files;
rows present in only one are listed as such.  These machines are noisy, so only the ratio of
turns taken minutes apart means anything, and a row within +-15% is "within noise".
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]


def _git(*args: str, cwd: Path = HERE) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def prepare(ref: str) -> Path:
    """The built worktree of `ref` (created and built on first use)."""
    sha = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    tree = HERE / ".benchmarks" / f"against-{sha[:12]}"
    if not (tree / ".git").exists():
        tree.parent.mkdir(parents=True, exist_ok=True)
        _git("worktree", "add", "--detach", str(tree), sha)
    print(f"before: {ref} = {sha[:12]} in {tree}", flush=True)
    subprocess.run(["make", "-s", "build"], cwd=tree, check=True)
    subprocess.run([str(tree / ".venv/bin/python"), "-m", "pip", "-q", "--disable-pip-version-check",
                    "install", "--no-build-isolation", "-e", ".[dev,spark,bench]"], cwd=tree, check=True)
    return tree


def run_file(tree: Path, bench_file: str, extra: list[str], out: Path) -> dict[str, float]:
    """{row name: best rate} of one bench file run in `tree` with its own interpreter."""
    base = Path(tempfile.gettempdir()) / f"pt-against-{os.getpid()}"
    subprocess.run(["rm", "-rf", str(base)], check=False)
    cmd = [str(tree / ".venv/bin/python"), "-m", "pytest", bench_file, "--benchmark-only", "-q",
           "-p", "no:cacheprovider", f"--basetemp={base}", f"--benchmark-json={out}", *extra]
    proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    subprocess.run(["rm", "-rf", str(base)], check=False)
    if not out.exists():
        print(f"  {tree.name}: {bench_file} produced no results (exit {proc.returncode})\n"
              + proc.stdout[-1500:], flush=True)
        return {}
    with open(out) as f:
        data = json.load(f)
    rates = {}
    for b in data["benchmarks"]:
        rate = (b.get("extra_info") or {}).get("records_per_s") or b["stats"]["ops"]
        rates[f"{b.get('group') or '-'} :: {b['name']}"] = rate
    return rates


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ref", help="the commit to compare against (a tag, branch or sha)")
    ap.add_argument("--rounds", type=int, default=2, help="turns each tree takes per bench file")
    ap.add_argument("--files", nargs="*", help="bench files (default: every tests/bench/test_*.py here)")
    ap.add_argument("--json", help="write the rows as JSON here too")
    ap.add_argument("--tree", help="an already built checkout of REF to use instead of a new worktree")
    args, extra = ap.parse_known_args(argv)  # the rest goes to pytest (e.g. -k send)
    extra = [a for a in extra if a != "--"]
    before_tree = Path(args.tree).resolve() if args.tree else prepare(args.ref)
    files = args.files or sorted(str(p.relative_to(HERE)) for p in (HERE / "tests/bench").glob("test_*.py"))
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for bench_file in files:
            for turn in range(args.rounds):
                for label, tree, rows in (("before", before_tree, before), ("after", HERE, after)):
                    if not (tree / bench_file).exists():
                        continue
                    print(f"[{turn + 1}/{args.rounds}] {label:6} {bench_file}", flush=True)
                    got = run_file(tree, bench_file, extra, Path(tmp) / f"{label}.json")
                    for name, rate in got.items():
                        rows[name] = max(rate, rows.get(name, 0.0))
                    (Path(tmp) / f"{label}.json").unlink(missing_ok=True)
    width = max((len(n) for n in before.keys() | after.keys()), default=20) + 2
    print(f"\n{'row':<{width}} {'before/s':>14} {'after/s':>14} {'after/before':>13}")
    report = []
    for name in sorted(before.keys() | after.keys()):
        b, a = before.get(name), after.get(name)
        ratio = a / b if a and b else None
        verdict = "" if ratio is None else ("  within noise" if abs(ratio - 1) <= 0.15
                                           else ("  faster" if ratio > 1 else "  SLOWER"))
        print(f"{name:<{width}} {b or 0:>14,.1f} {a or 0:>14,.1f} "
              f"{(f'{ratio:.2f}x' if ratio else ('only after' if a else 'only before')):>13}{verdict}")
        report.append({"row": name, "before": b, "after": a, "ratio": ratio})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ref": args.ref, "rows": report}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
