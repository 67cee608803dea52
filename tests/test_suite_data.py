"""The suite carries the data it reads: nothing under tests/ points at a folder beside or above
the checkout, so a bare clone (or a copy of it anywhere) runs the same tests."""
from pathlib import Path

from tests.paths import CAPTURES

TESTS = Path(__file__).resolve().parent


def test_captures_are_in_the_repository():
    assert CAPTURES.is_relative_to(TESTS)
    scenarios = {p.name.removesuffix(".jsonl") for p in CAPTURES.glob("*.jsonl")}
    assert {"producer", "producer_variants", "pull", "pull.client", "pull_bad_compressed", "push_orderly"} <= scenarios


def test_no_test_reads_outside_the_checkout():
    for path in TESTS.rglob("*.py"):
        text = path.read_text()
        for outside in ("/work/", '"shared" /', "shared" + "/protocol"):  # (spelled so this file names neither)
            assert outside not in text or path.name == Path(__file__).name, f"{path}: {outside!r}"
