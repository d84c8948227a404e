"""Render the PNG of each table of a saved `bench.json` (e.g. a run stopped before a table ended, or a
GPU machine without matplotlib): `python scripts/bench_plot.py BENCH_JSON OUT_DIR [TABLE_ID ...]`.
Same plot as `dflash-parity bench` writes (parity.bench.render.write_png): value against B on a log2
axis, one line per row, one panel per row group; ratio tables get the 1.0 line and the B=32 threshold.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from parity.bench.render import write_png
from parity.bench.tables import Cell, Row, Table


def table_from_json(t: dict) -> Table:
    head_names = list(t["rows"][0]["head"]) if t["rows"] else []
    tail_names = list(t["rows"][0]["tail"]) if t["rows"] else []
    rows = [Row(label=r["label"], head=list(r["head"].values()),
                cells={int(x): Cell(c["value"], c["text"]) for x, c in r["cells"].items()},
                tail=list(r["tail"].values()), parity=r["parity"], notes=r.get("notes", ""),
                failed=bool(r.get("failed")), group=r.get("group", "")) for r in t["rows"]]
    ratio = t["unit"] == "ratio"
    title = t["title"] + ("" if t.get("complete", True) else " [INCOMPLETE]")
    return Table(id=t["id"], title=title, unit=t["unit"], columns=list(t["columns"]), head_names=head_names,
                 tail_names=tail_names, rows=rows, complete=t.get("complete", True),
                 hline=1.0 if ratio else None, vline=32 if ratio else None)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    data = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    wanted = set(argv[2:])
    for t in data["tables"]:
        if wanted and t["id"] not in wanted:
            continue
        why = write_png(table_from_json(t), out / f"{t['id']}.png")
        print(f"{t['id']}: " + (why or f"wrote {out / (t['id'] + '.png')}"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
