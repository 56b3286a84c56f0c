"""Plain text for the command line and for error messages (both sides print them): byte counts,
tables, the closest known name to a mistyped one."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def format_table(rows: list[list], headers: list[str]) -> str:
    """Plain-text table, columns left-aligned, numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(isinstance(r[i], (int, float)) for r in rows) and rows for i in range(len(headers))]
    lines = []
    for k, r in enumerate(cells):
        parts = [c.rjust(w) if numeric[i] and k else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(parts).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def closest(word: str, known) -> str | None:
    """The one name of ``known`` closest to a mistyped ``word`` (difflib's ratio of at least
    0.6, the ratio Python's own "Did you mean" uses), or None when none is close."""
    import difflib

    found = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return found[0] if found else None


def shown(value, limit: int = 120) -> str:
    """``repr(value)`` cut to about ``limit`` characters, in time and memory that follow the
    limit, never the value: a list of a million items, or one that holds itself, is shown by
    its first few items (``reprlib``). For values read from a user's file into a message."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxtuple, r.maxdict, r.maxset = 3, 8, 8, 6, 6
    r.maxstring = r.maxother = r.maxlong = limit
    text = r.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
