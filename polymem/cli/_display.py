r"""What the CLI prints of data it did not write itself: paths, provenance, tokenizer names, JSON keys, reasons.

    escape("a\x1b[31mb [bold]")   # the string  a\x1b[31mb \[bold]   which rich prints as  a\x1b[31mb [bold]

One helper for both dangers of printing such a string to a terminal through rich: its C0 and C1 control
characters (ESC starts the terminal's own escape sequences: colours, cursor moves, window titles, hyperlinks)
are shown as ``\x1b``-style escapes, and its ``[``-tags are escaped so rich prints them literally rather than as
markup. Newlines and tabs are control characters too: a multi-line value is escaped line by line by its caller.

What this module does not do: decide what to print, or touch what goes to files (JSON escapes control
characters itself).
"""

from __future__ import annotations

from rich.markup import escape as _markup_escape

# C0 (U+0000..U+001F), DEL and C1 (U+0080..U+009F): each shown as \xNN
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}


def controls(text: str) -> str:
    r"""``text`` with every C0/C1 control character (and DEL) shown as ``\xNN``; for output printed without
    markup."""
    return text.translate(_CONTROLS)


def escape(value: object) -> str:
    r"""``str(value)`` safe to print with rich: control characters shown as ``\xNN``, markup escaped."""
    return _markup_escape(controls(str(value)))


_TEXT_CONTROLS = {k: v for k, v in _CONTROLS.items() if k not in (0x0A, 0x09)}


def escape_text(text: str) -> str:
    r"""Generated or quoted text as a reader wants it in the terminal: its newlines and tabs kept, every other
    control character shown as ``\xNN`` and markup escaped (``"a\nb\x1b[2J"`` prints as two lines, ``a`` and
    ``b\x1b[2J``)."""
    return _markup_escape(str(text).translate(_TEXT_CONTROLS))


def escape_lines(text: str) -> str:
    """:func:`escape` for each line of a message whose line breaks are its own (a multi-line error)."""
    return "\n".join(escape(line) for line in text.split("\n"))
