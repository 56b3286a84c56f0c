"""The shell blocks of a Markdown document, in order, and what a test does with each.

Runs in the pytest process and starts nothing. A block is an indented code block (four
spaces, after a blank line, outside a fence) or a fenced one whose language is a shell's or
none; ``python`` fences are not shell. ``kind`` sorts a block into what the test can do with
it, from the block's own text:

- ``output``: its first word is no command (the lines a command printed, shown after it);
- ``synopsis``: usage notation, not a command line to paste: ``[optional]`` parts, ``a|b``
  choices, ``...``, or upper-case placeholders (``DATA``, ``DIR``, ``OUT``); its ``pixpool``
  lines are parsed by the commands' own parsers instead of run (``synopsis_argvs``);
- ``run``: everything else: a sequence of commands that runs as written.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

SHELL_FENCES = ("", "sh", "bash", "shell", "console")
COMMAND_WORDS = ("pixpool", "pip", "python", "torchrun", "kill", "wait", "cd", "docker", "export")
PLACEHOLDERS = {"DATA": "data.yaml", "DIR": "sock", "OUT": "out", "SECONDS": "5", "FILE": "file"}
_SYNOPSIS = re.compile(r"\[[-\w]|\w\|\w|(?<![\w/])\.\.\.(?![\w/])|\b(?:%s)\b" % "|".join(PLACEHOLDERS))


@dataclass(frozen=True)
class Block:
    doc: str  # the document's path relative to the repository
    line: int  # 1-based line of the block's first line
    text: str  # the block's lines, indentation removed

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0]

    @property
    def kind(self) -> str:
        if self.text.split()[0] not in COMMAND_WORDS:
            return "output"
        bare = re.sub(r"\"[^\"]*\"|'[^']*'", "", _without_comments(self.text))  # ".[train]" is no notation
        return "synopsis" if _SYNOPSIS.search(bare) else "run"

    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def shell_blocks(path: Path, root: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    doc = str(path.relative_to(root))
    out: list[Block] = []
    fence: str | None = None
    start, body = 0, []
    previous_blank = True
    for i, line in enumerate(lines, 1):
        if fence is not None:
            if line.startswith("```"):
                if fence in SHELL_FENCES and body:
                    out.append(Block(doc, start, "\n".join(body)))
                fence, body = None, []
            else:
                body.append(line)
            continue
        if line.startswith("```"):
            _flush(out, doc, start, body)
            fence, start, body = line[3:].strip(), i + 1, []
            continue
        if line.startswith("    ") and line.strip() and (body or previous_blank):
            if not body:
                start = i
            body.append(line[4:])
        elif body and not line.strip():
            _flush(out, doc, start, body)
            body = []
        elif body:
            _flush(out, doc, start, body)
            body = []
        previous_blank = not line.strip()
    _flush(out, doc, start, body)
    return out


def _flush(out: list[Block], doc: str, start: int, body: list[str]) -> None:
    if body:
        out.append(Block(doc, start, "\n".join(body)))


def _without_comments(text: str) -> str:
    return "\n".join(line.split(" #", 1)[0] for line in text.splitlines())


def synopsis_argvs(block: Block) -> list[list[str]]:
    """Each ``pixpool`` command of a synopsis block as an argv: optional parts included,
    the first of each ``a|b`` choice, placeholders filled in, ``...`` dropped."""
    argvs = []
    for line in _without_comments(block.text).splitlines():
        line = re.sub(r"\[([^\]]*)\]", r"\1", line)
        line = re.sub(r"(\w[\w-]*)(\|[\w-]+)+", r"\1", line)
        for command in re.split(r"\s*(?:;|&&)\s*", line):
            words = [PLACEHOLDERS.get(w, w) for w in shlex.split(command) if w != "..."]
            if words and words[0] == "pixpool":
                argvs.append(words)
    return argvs
