"""Time one setting of the course (smoke, laptop, classroom) and store it in the timing record.

Runs the setting's notebooks with ``run_series`` into a new folder under ``runs/notebooks/``, then
writes its ``series.json`` (every stage with its wall time and the ``code_sha256`` of the notebook
it timed, the load at the start and the end) into ``envace_lite.course.timings.RECORD`` under the
setting's name, with the machine and the command; then rewrites every marked timing region of the
docs and of the notebooks' headers from the record (``--docs-only`` does only that). Run it on
idle cores: the record says what the load was.

Usage (from the repository root)::

    python benchmarks/series_timings.py --setting smoke
    python benchmarks/series_timings.py --setting laptop
    python benchmarks/series_timings.py --setting classroom
    python benchmarks/series_timings.py --docs-only
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, command_line, machine_info, write_json  # noqa: E402

from envace_lite.course.helpers import NOTEBOOKS_DIR  # noqa: E402
from envace_lite.course.series import NotebookFailed, run_series  # noqa: E402
from envace_lite.course.timings import (  # noqa: E402
    DOCS, RECORD, SETTINGS, load_record, write_marked)


def rewrite_docs(record: dict) -> list[str]:
    """Rewrite the marked regions of ``DOCS`` and of every notebook's first markdown cell;
    return the paths that changed."""
    changed = []
    for rel in DOCS:
        path = ROOT / rel
        text = path.read_text()
        new = write_marked(text, record)
        if new != text:
            path.write_text(new)
            changed.append(rel)
    for nb in sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")):
        data = json.loads(nb.read_text())
        head = next(c for c in data["cells"] if c["cell_type"] == "markdown")
        text = "".join(head["source"])
        new = write_marked(text, record)
        if new != text:
            head["source"] = new.splitlines(keepends=True)
            nb.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
            changed.append(str(nb.relative_to(ROOT)))
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setting", choices=sorted(SETTINGS))
    ap.add_argument("--docs-only", action="store_true", help="only rewrite the marked regions")
    args = ap.parse_args(argv)
    record = load_record()
    if not args.docs_only:
        if not args.setting:
            ap.error("--setting is required (or --docs-only)")
        s = SETTINGS[args.setting]
        start = time.perf_counter()
        try:
            series = run_series(s["profile"], s["only"], parameters=s["parameters"])
        except NotebookFailed as exc:
            print(f"not stored: {exc}", file=sys.stderr)
            return 1
        meta = json.loads((series / "series.json").read_text())
        meta.update(command=command_line("series_timings.py", argv),
                    command_seconds=round(time.perf_counter() - start, 1),
                    machine=machine_info(), date=time.strftime("%Y-%m-%d"))
        record[args.setting] = meta
        write_json(RECORD, record)
        print(f"stored {args.setting}: {sum(st['seconds'] for st in meta['stages']):.1f} s in "
              f"the notebooks, load {meta['load']['start']:.2f} -> {meta['load']['end']:.2f}")
    for path in rewrite_docs(record):
        print(f"rewrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
