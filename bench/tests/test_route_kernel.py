"""bench/route.py --what kernel's choice of arms: another commit's kernel, or one build at two lane
widths (``--lanes``), each call of an arm run at that arm's width. Starts no process, builds nothing.
"""

from __future__ import annotations

import pytest
import route


def test_lanes_are_two_known_widths_and_the_first_is_the_base():
    p = route.common.parser("x", "route.py --what kernel")
    assert route._lane_widths(p, None) is None
    assert route._lane_widths(p, "8,16") == (8, 16)
    assert route._lane_widths(p, "16,4") == (16, 4)


@pytest.mark.parametrize("text", ["8", "8,16,4", "8,x", "8,32"])
def test_other_lanes_stop_with_the_option_named(text, capsys):
    p = route.common.parser("x", "route.py --what kernel")
    with pytest.raises(SystemExit):
        route._lane_widths(p, text)
    assert "--lanes" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["--base", "HEAD", "--lanes", "8,16"]])
def test_kernel_needs_exactly_one_of_base_and_lanes(argv, capsys):
    with pytest.raises(SystemExit):
        route.kernel_main(argv)
    assert "name one of --base REF and --lanes A,B" in capsys.readouterr().err


def test_base_flags_go_with_base_only(capsys):
    with pytest.raises(SystemExit):
        route.kernel_main(["--lanes", "8,16", "--base-flags=-O2"])
    assert "--base-flags builds the --base kernel" in capsys.readouterr().err


def test_each_arm_sets_its_width_before_every_call():
    calls = []

    class Module:
        width = 4

        def set_lanes(self, n):
            before, self.width = self.width, n
            return before

        def render(self, *args):
            calls.append((self.width, args))

    module = Module()
    base, this = route._AtLanes(module, 8), route._AtLanes(module, 16)
    base.render(1), this.render(2), base.render(3)
    assert calls == [(8, (1,)), (16, (2,)), (8, (3,))]
