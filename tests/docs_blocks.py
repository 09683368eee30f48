"""Read the fenced code blocks of the project's Markdown files and split shell blocks into commands.

Used by ``tests/test_docs.py``, which runs every command and snippet of README.md and docs/*.md. Kept apart from the
test so the parsing can be reused and read on its own: no pytest here.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Languages whose blocks are run, and those that are shown to the reader only (output, data, file contents).
SHELL_LANGS = {"bash", "sh", "shell", "console"}
RUN_LANGS = SHELL_LANGS | {"python"}
SHOWN_LANGS = {"text", "json", "yaml", "toml", "ini"}

_FENCE = re.compile(r"^(?P<indent>[ ]{0,12})(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is (``doc`` relative to the repository, 1-based ``line`` of the fence) and what."""

    doc: str
    line: int
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass(frozen=True)
class Command:
    """One logical shell command of a block (continuation lines joined, the comment removed).

    ``expected`` holds the output lines a ``console`` transcript shows after the command (``$ cmd`` then its output).
    """

    block: Block
    line: int
    text: str
    expected: tuple[str, ...] = field(default=())

    @property
    def where(self) -> str:
        return f"{self.block.doc}:{self.line}"


def doc_files() -> list[Path]:
    """README.md and every docs/*.md: the documents whose blocks must run."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def read_blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path`` in order. A fence may be indented (inside a list item); the indentation of its
    opening line is removed from its content."""
    doc = path.relative_to(ROOT).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence = len(match["indent"]), match["fence"]
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{doc}:{start + 1}: code block is never closed")
        blocks.append(Block(doc, start + 1, match["lang"].lower(), "\n".join(body) + "\n"))
        i += 1
    return blocks


def all_blocks() -> list[Block]:
    return [block for path in doc_files() for block in read_blocks(path)]


def _strip_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` inside quotes or a word stays)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=False)
    lexer.whitespace_split, lexer.commenters = True, "#"
    try:
        words = list(lexer)
    except ValueError:  # unbalanced quotes: leave the line to the shell, which will say so
        return line.rstrip()
    if not words:
        return ""
    # Cut the original text after the last kept word so quoting and spacing stay as written.
    cut = line.find(" #")
    while cut != -1:
        try:
            if shlex.split(line[:cut]) == words:
                return line[:cut].rstrip()
        except ValueError:
            pass
        cut = line.find(" #", cut + 1)
    return line.rstrip()


def commands(block: Block) -> list[Command]:
    """The logical commands of a shell block.

    ``bash``/``sh`` blocks: every non-blank, non-comment line is a command (``a && b`` two); a trailing ``\\``
    continues it. ``console``
    blocks: lines starting with ``$ `` are commands, the lines after one (up to the next) its expected output.
    """
    if block.lang not in SHELL_LANGS:
        raise ValueError(f"{block.where}: not a shell block ({block.lang!r})")
    result: list[Command] = []
    lines = block.text.splitlines()
    console = block.lang == "console"
    i = 0
    while i < len(lines):
        raw = lines[i]
        if console:
            if not raw.startswith("$ "):
                if raw.strip():
                    raise ValueError(f"{block.doc}:{block.line + 1 + i}: console output before any '$ ' command")
                i += 1
                continue
            raw = raw[2:]
        start = i
        while raw.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            raw = raw.rstrip()[:-1].rstrip() + " " + lines[i].strip()
        i += 1
        text = _strip_comment(raw).strip()
        expected: list[str] = []
        if console:
            while i < len(lines) and not lines[i].startswith("$ "):
                expected.append(lines[i])
                i += 1
            while expected and not expected[-1].strip():
                expected.pop()
        # `a && b` is two commands (each may be run or skipped on its own); set -e keeps `&&`'s meaning.
        parts = [part.strip() for part in text.split(" && ")] if not console else [text]
        for part in filter(None, parts):
            result.append(Command(block, block.line + 1 + start, part, tuple(expected)))
    return result
