"""The extension's check messages format numbers with ``std::to_string``.

Streaming an integer into a ``TORCH_CHECK`` message segfaulted the process in the
extension built on the GPU machine (torch 2.11), where the same call should raise
(``docs/design.md``, "Findings worth knowing"); CI's CPU build does not crash, so
the rule is checked on the sources: no message argument of a ``TORCH_CHECK*``
macro in ``cuda/`` calls ``size``, ``dim``, ``numel`` or ``stride`` unless it is
formatted by ``std::to_string`` (or the glue's ``num`` / ``shape`` helpers).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, List, Tuple

CUDA = Path(__file__).resolve().parents[1] / "cuda"
MACRO = re.compile(r"\bTORCH_(?:CHECK|CHECK_VALUE|CHECK_INDEX|CHECK_TYPE|CHECK_NOT_IMPLEMENTED)\s*\(")
NUMBER_CALL = re.compile(r"\b(?:size|dim|numel|stride)\s*\(")
FORMATTED = re.compile(r"^\s*(?:std::to_string|num|shape)\s*\(")


def _args(text: str, start: int) -> List[str]:
    """The top-level comma-separated arguments of the call whose '(' is at start."""
    depth, args, cur, i = 0, [], [], start
    in_str = False
    while i < len(text):
        ch = text[i]
        if in_str:
            cur.append(ch)
            if ch == "\\":
                cur.append(text[i + 1])
                i += 1
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
            cur.append(ch)
        elif ch == "(":
            depth += 1
            if depth > 1:
                cur.append(ch)
        elif ch == ")":
            depth -= 1
            if depth == 0:
                args.append("".join(cur))
                return args
            cur.append(ch)
        elif ch == "," and depth == 1:
            args.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    raise ValueError("unbalanced macro call")


def _message_args() -> Iterator[Tuple[str, str]]:
    """``(file:line, argument)`` for every message argument of a check in ``cuda/``."""
    for path in sorted(CUDA.rglob("*")):
        if path.suffix not in (".cpp", ".cu", ".cuh", ".h"):
            continue
        text = path.read_text()
        for m in MACRO.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            for arg in _args(text, m.end() - 1)[1:]:  # the first is the condition
                yield f"{path.relative_to(CUDA)}:{line}", arg.strip()


def _streams_number(arg: str) -> bool:
    return bool(NUMBER_CALL.search(arg)) and not FORMATTED.match(arg) and not arg.startswith('"')


def test_the_scan_sees_the_checks():
    """The parser finds the glue's checks and their message arguments."""
    found = list(_message_args())
    assert len({where for where, _ in found}) > 40
    assert any("std::to_string" in arg for _, arg in found)


def test_the_rule_flags_a_streamed_size():
    """What the rule rejects and accepts, on made-up message arguments."""
    assert _streams_number("weights.size()")
    assert _streams_number("x.dim()")
    assert not _streams_number("std::to_string(weights.size())")
    assert not _streams_number("num(x.size(0))")
    assert not _streams_number('" must be [2, E], got "')
    assert not _streams_number("t.scalar_type()")


def test_no_check_message_streams_a_number():
    bad = [f"{where}: {arg}" for where, arg in _message_args() if _streams_number(arg)]
    assert not bad, "format these with std::to_string:\n" + "\n".join(bad)
