"""The bench scripts' shared helpers (bench/_common.py) that decide what a table says: the order
of the arms, the paired ratios, the tables and the blocks written into docs/benchmarks.md, and
which question of a script runs. Starts no process.
"""

from __future__ import annotations

import _common as common
import pytest


def test_arms_alternate_or_rotate_round_by_round():
    assert [common.alternate("ab", r) for r in range(3)] == [["a", "b"], ["b", "a"], ["a", "b"]]
    assert [common.alternate("abc", r, rotate=True) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


def test_rounds_runs_every_arm_once_a_round_in_the_alternating_order_after_a_warm_up():
    calls = []
    got = common.rounds({"a": lambda: calls.append("a") or len(calls), "b": lambda: calls.append("b") or len(calls)}, 2, warmup=True)  # fmt: skip
    assert calls == ["a", "b", "a", "b", "b", "a"]
    assert got == {"a": [3, 6], "b": [4, 5]}


def test_paired_ratios_are_per_round_and_every_round_is_listed():
    assert common.ratios([2.0, 3.0, 8.0], [1.0, 2.0, 2.0]) == [2.0, 1.5, 4.0]
    assert common.paired([2.0, 3.0, 8.0], [1.0, 2.0, 2.0]) == "2.00x (2.00, 1.50, 4.00)"
    with pytest.raises(ValueError, match="equal, non-empty"):
        common.ratios([1.0], [1.0, 2.0])


def test_a_headline_needs_five_pairs_that_agree_within_a_quarter():
    steady = ([200.0, 210.0, 190.0, 205.0, 200.0], [100.0] * 5)  # ratios 1.9-2.1: spread 10 %
    assert common.headline(*steady) == (2.0, "**2.00x**")
    value, why = common.headline(steady[0][:4], steady[1][:4])
    assert value is None and why == "none: 4 pairs, a headline needs 5"
    # The project's own run of 2026-12-03 (2.31, 1.54, 1.82, 1.70, 2.28): spread 42 %, no headline.
    value, why = common.headline([231.0, 154.0, 182.0, 170.0, 228.0], [100.0] * 5)
    assert value is None and why.startswith("none: the pairs spread 42% (over 25%)")
    assert (
        common.spread([1.0, 1.25, 1.0, 1.0, 1.0]) == 0.25
        and common.headline([100, 125, 100, 100, 100], [100] * 5)[0] == 1.0
    )


def test_a_table_aligns_text_left_and_numbers_right():
    assert common.table(["arm", "ms"], [["a", 1.5]]) == "| arm | ms |\n| --- | ---: |\n| a | 1.5 |"


def test_a_section_is_replaced_between_its_markers_or_appended(tmp_path):
    doc = tmp_path / "b.md"
    doc.write_text("# B\n\nbefore\n<!-- k: start -->\nold\n<!-- k: end -->\nafter\n")
    common.write_section(doc, "k", "new", "## K")
    assert doc.read_text() == "# B\n\nbefore\n<!-- k: start -->\nnew\n<!-- k: end -->\nafter\n"
    common.write_section(doc, "other", "text", "## Other")
    assert doc.read_text().endswith("after\n\n## Other\n\n<!-- other: start -->\ntext\n<!-- other: end -->\n")


def test_what_picks_the_question_and_the_parser_keeps_the_command_that_reproduces_it():
    seen = {}

    def first(argv):
        p = common.parser("The first question.\n\nMore.", "store.py --what first")
        p.add_argument("--n", type=int, default=1)
        seen["first"] = p.parse_args(argv)

    def second(argv):
        seen["second"] = argv
        return 3

    whats = {"first": (first, "one"), "second": (second, "two")}
    assert common.dispatch(whats, ["--n", "2"]) == 0
    assert seen["first"].n == 2 and seen["first"].command == "python bench/store.py --what first --n 2"
    assert common.dispatch(whats, ["--what", "second", "--n", "5"]) == 3 and seen["second"] == ["--n", "5"]


def test_status_gives_an_older_clients_dict_reply_attribute_access(monkeypatch):
    import pixpool.ops.status_client as client

    reply = {"daemon": {"pid": 7}, "workers": [{"pid": 8, "busy_s": 1.5}, {"pid": 0, "busy_s": 0.0}]}
    monkeypatch.setattr(client, "query_status", lambda socket_dir, timeout_s: reply)
    st = common.status("/nowhere")
    assert st.daemon.pid == 7
    assert [(w.pid, w.busy_s) for w in st.workers] == [(8, 1.5), (0, 0.0)]
    typed = object()  # a typed reply is passed through as it is
    monkeypatch.setattr(client, "query_status", lambda socket_dir, timeout_s: typed)
    assert common.status("/nowhere") is typed
