"""Text from plugins and from reports read back (lowering names, `available()` reasons, notes, failure
messages, case fields), made inert in the Markdown and XML the reports write: it can change no heading,
no table row, no verdict of `summary.md`, `gate.md` or `junit.xml`.

- `md_code(text, table=False)`: an inline code span showing `text` as it is: a fence one backtick longer
  than the longest run of backticks in it (padded with a space where it starts or ends with one);
  control characters (a newline, a carriage return, an escape; U+2028/2029/0085 too) shown as Python
  escapes (`\\n`, `\\x1b`, `\\u2028`), so the span stays on its line; in a table cell (`table`) each `|`
  as `\\|`, which GitHub Markdown shows as `|` without ending the cell.
- `md_text(text, table=False)`: plain text shown as it is: control characters as above; `\\`, `` ` ``,
  `*` and `<` backslash-escaped (no code span, emphasis, HTML or autolink can start), `_` too unless
  between two letters or digits (`block_size` stays as it is, and never emphasises); `](` as `]\\(` (no
  link or image); a leading `# `, `>`, `+ `, `- ` or `1. ` escaped (no heading, quote or list where
  the text starts a list item; not in a table cell, which holds inline text only); in a table cell each
  `|` as `\\|`. Text without any of these is unchanged.
- `xml_text(text)`: the characters XML 1.0 cannot hold (controls but tab, newline and carriage return;
  lone surrogates; U+FFFE, U+FFFF) shown as Python escapes; `xml.sax.saxutils` escapes the rest.

Public: `md_code`, `md_text`, `xml_text`.
"""

from __future__ import annotations

import re
from typing import Any

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_SPECIAL = re.compile(r"[\\`*<]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|(?<=\])\(")
_LEADING = re.compile(r"^\s*(?:(?:#{1,6}(?=\s|$)|[+-](?=\s|$)|>)|\d+(?=[.)](?:\s|$)))")


def _visible(m: re.Match) -> str:
    return ascii(m.group(0))[1:-1]


def md_code(text: Any, table: bool = False) -> str:
    """`text` as an inline code span (see the module docstring)."""
    s = _CONTROL.sub(_visible, str(text))
    if table:
        s = s.replace("|", "\\|")
    run = max((len(r) for r in re.findall(r"`+", s)), default=0)
    fence = "`" * (run + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md_text(text: Any, table: bool = False) -> str:
    """`text` as inert Markdown text (see the module docstring)."""
    s = _SPECIAL.sub(lambda m: "\\" + m.group(0), str(text))
    s = _CONTROL.sub(_visible, s)
    m = None if table else _LEADING.match(s)  # a table cell holds inline text only
    if m:  # before the marker (a digit run: before its `.` or `)`)
        at = m.end() if m.group(0)[-1].isdigit() else len(m.group(0)) - len(m.group(0).lstrip())
        s = s[:at] + "\\" + s[at:]
    if table:
        s = s.replace("|", "\\|")
    return s


def xml_text(text: Any) -> str:
    """`text` with the characters XML 1.0 cannot hold shown as escapes (see the module docstring)."""
    return _XML_BAD.sub(_visible, str(text))
