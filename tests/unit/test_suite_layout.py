"""The suite collects in one run: test modules are imported by their file name (no packages
under tests/), so two files of one name in unit/ and integration/ stop collection for every
test (CI's Ultralytics stage, which collects both folders, hit it)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_name():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, count in names.items() if count > 1] == []
