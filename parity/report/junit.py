"""`junit.xml` of a report: one test case per lowering (a failure with its messages, a skip with its
reason), and a failing `nothing judged` case when the run judged nothing (all skipped must not read as
success). Lowering names, reasons and messages come from plugins (or from shard reports `merge` reads):
XML-escaped, and the characters XML 1.0 cannot hold shown as escapes (`parity.report.escape.xml_text`), so the
file always parses and no name adds a test case or a verdict.

Public: `junit_xml(data)`.
"""

from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape, quoteattr

from parity.report.escape import xml_text
from parity.report.lse import junit_properties


def junit_xml(data: dict[str, Any]) -> str:
    lows = data["lowerings"]
    n_fail = sum(1 for v in lows.values() if v["status"] == "fail")
    n_skip = sum(1 for v in lows.values() if v["status"] == "unavailable")
    nothing = data.get("verdict") == "nothing judged"
    lines = ['<?xml version="1.0" encoding="utf-8"?>',
             f'<testsuite name="dflash-parity" tests="{len(lows) + nothing}" failures="{n_fail + nothing}" '
             f'skipped="{n_skip}" errors="0">']
    if nothing:  # all skipped must not read as success
        msg = "nothing was judged: every lowering unavailable or every case unsupported"
        lines.append(f'  <testcase classname="dflash-parity" name="nothing judged"><failure message={quoteattr(msg)}/>'
                     f'</testcase>')
    for name, v in lows.items():  # plugin text: XML-escaped, the characters XML cannot hold shown as escapes
        attrs = (f'classname={quoteattr("dflash-parity." + xml_text(data["device"]))} name={quoteattr(xml_text(name))} '
                 f'time="{_seconds(v.get("seconds"))}"')
        if v["status"] == "fail":
            msg = xml_text("; ".join(str(f) for fl in v["failures"] for f in fl["failures"]) or
                           "; ".join(map(str, v["notes"])))
            lines.append(f"  <testcase {attrs}>{junit_properties(v)}<failure message={quoteattr(msg[:500])}>"
                         f"{escape(msg)}</failure></testcase>")
        elif v["status"] == "unavailable":
            lines.append(f"  <testcase {attrs}><skipped message={quoteattr(xml_text(v['reason']))}/></testcase>")
        elif junit_properties(v):
            lines.append(f"  <testcase {attrs}>{junit_properties(v)}</testcase>")
        else:
            lines.append(f"  <testcase {attrs}/>")
    lines.append("</testsuite>")
    return "\n".join(lines) + "\n"


def _seconds(x: Any) -> str:
    """A junit `time` attribute: the number as it is, 0 for anything else (a report read back is input)."""
    return str(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) < float("inf") else "0"
