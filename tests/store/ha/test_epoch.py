"""EpochFileCache (rmq_core/store/ha/epoch.py): the file, its checks, and the consistent point."""
from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_core.errors import StoreError
from rmq_core.store.ha.epoch import EpochEntry, EpochFileCache


def _cache(tmp_path, *pairs) -> EpochFileCache:
    c = EpochFileCache(str(tmp_path / "epochFileCheckpoint"))
    for epoch, start in pairs:
        c.append(epoch, start)
    return c


def test_empty_then_append_persists_and_reloads(tmp_path):
    c = _cache(tmp_path)
    assert c.entries() == [] and c.last_epoch() == 0
    c.append(1, 0)
    c.append(3, 500)
    assert c.last_epoch() == 3
    with open(tmp_path / "epochFileCheckpoint") as f:
        assert f.read() == "1 0\n3 500\n"
    assert EpochFileCache(str(tmp_path / "epochFileCheckpoint")).entries() == [EpochEntry(1, 0), EpochEntry(3, 500)]
    assert not os.path.exists(str(tmp_path / "epochFileCheckpoint") + ".tmp")


def test_append_checks_order(tmp_path):
    c = _cache(tmp_path, (2, 100))
    with pytest.raises(ValueError, match=r"epoch 2 does not grow past the last epoch 2"):
        c.append(2, 200)
    with pytest.raises(ValueError, match=r"start offset 50 is before epoch 2's start offset 100"):
        c.append(3, 50)
    c.append(3, 100)  # an empty term: the same start is allowed
    assert c.entries() == [EpochEntry(2, 100), EpochEntry(3, 100)]


@pytest.mark.parametrize("text, line", [("1 0\n2 x\n", 2), ("1 0 7\n", 1), ("3 0\n2 10\n", 2), ("1 50\n2 10\n", 2),
                                        ("1 0\n2", 2)])
def test_garbled_file_names_file_and_line(tmp_path, text, line):
    path = tmp_path / "epochFileCheckpoint"
    path.write_text(text)
    with pytest.raises(StoreError, match=rf"{path}.*line {line}"):
        EpochFileCache(str(path))


def test_truncate_from_and_replace_suffix(tmp_path):
    c = _cache(tmp_path, (1, 0), (2, 100), (4, 300))
    c.truncate_from(300)  # an entry starting at the cut goes
    assert c.entries() == [EpochEntry(1, 0), EpochEntry(2, 100)]
    c.truncate_from(101)
    assert c.entries() == [EpochEntry(1, 0), EpochEntry(2, 100)]
    c.replace_suffix([EpochEntry(1, 0), EpochEntry(3, 80), EpochEntry(5, 400)])
    assert c.entries() == [EpochEntry(1, 0), EpochEntry(3, 80), EpochEntry(5, 400)]
    assert EpochFileCache(c.path).entries() == c.entries()
    with pytest.raises(ValueError, match="do not grow"):
        c.replace_suffix([EpochEntry(3, 0), EpochEntry(2, 10)])


def test_to_json(tmp_path):
    c = _cache(tmp_path, (1, 0), (2, 100))
    assert c.to_json(250) == [{"epoch": 1, "startOffset": 0, "endOffset": 100},
                              {"epoch": 2, "startOffset": 100, "endOffset": 250}]


def test_consistent_point_cases(tmp_path):
    E = EpochEntry
    c = _cache(tmp_path, (1, 0), (2, 100))
    # the same history, the slave behind: its own end
    assert c.find_consistent_point([E(1, 0), E(2, 100)], 500, 300) == 300
    # the slave wrote more of epoch 2 than the master kept (the master moved on at 250)
    assert c.find_consistent_point([E(1, 0), E(2, 100), E(3, 250)], 900, 400) == 250
    # epoch 2 is not the master's (it holds epoch 3 from 80): epoch 1 is common up to 80
    assert c.find_consistent_point([E(1, 0), E(3, 80)], 900, 400) == 80
    # the same epoch with another start is not common
    assert c.find_consistent_point([E(1, 0), E(2, 120)], 900, 400) == 100
    # nothing common: 0 (cut everything) ...
    assert c.find_consistent_point([E(5, 0)], 900, 400) == 0
    assert c.find_consistent_point([], 0, 400) == 0
    # ... and -1 with no entries of its own (the log is kept as it is)
    assert _cache(tmp_path / "x").find_consistent_point([E(1, 0)], 900, 400) == -1


def _histories():
    """A master's history and a slave that followed it up to some point, then (maybe) wrote a
    term of its own as a master nobody followed."""
    return st.tuples(
        st.lists(st.integers(1, 100), min_size=1, max_size=6),  # lengths of the master's terms
        st.integers(0, 600),  # how far the slave followed
        st.integers(0, 100),  # bytes of its own term (0: none)
    )


@settings(max_examples=200, deadline=None)
@given(_histories())
def test_consistent_point_is_the_common_prefix(tmp_path_factory, hist):
    lengths, followed, own = hist
    master, start = [], 0
    for i, n in enumerate(lengths):
        master.append(EpochEntry(2 * i + 1, start))
        start += n
    master_max = start
    followed = min(followed, master_max)
    c = EpochFileCache(str(tmp_path_factory.mktemp("e") / "epochFileCheckpoint"))
    c.replace_suffix([e for e in master if e.start_offset <= followed])
    my_max = followed
    if own:
        c.append(c.last_epoch() + 1, followed)  # (even: never one of the master's)
        my_max += own
    point = c.find_consistent_point(master, master_max, my_max)
    # every byte below the point is the master's; the slave's own term is never kept
    assert point == followed
