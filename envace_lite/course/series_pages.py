"""The HTML pages of a notebook series run dir: each executed notebook's export and the index.

``export_html`` writes ``<notebook>.html`` beside an executed notebook (nbconvert's ``lab``
template, or ``minimal_html`` when nbconvert fails); ``write_index`` writes the series dir's
``series.json`` and ``index.html``, which link every notebook, its export, parameters, log and
figures, with its status and wall time. ``series.py`` calls them after each notebook.
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from envace_lite.progress import get_logger

log = get_logger(__name__)


def export_html(executed: Path) -> Path:
    """Write ``<notebook>.html`` beside an executed notebook (nbconvert; a minimal fallback)."""
    import nbformat

    nb = nbformat.read(str(executed), as_version=4)
    try:
        from nbconvert import HTMLExporter

        body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    except Exception as e:  # noqa: BLE001 (nbconvert missing or its template broken)
        log.warning("nbconvert HTML export failed (%s); using the minimal exporter", e)
        body = minimal_html(nb)
    path = executed.with_suffix(".html")
    path.write_text(body, encoding="utf-8")
    return path


def minimal_html(nb: Any) -> str:
    """A plain HTML page of a notebook: sources, text, HTML and PNG outputs, errors."""
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    parts = ["<!doctype html><meta charset='utf-8'><body style='font-family:sans-serif'>"]
    for cell in nb.cells:
        src = html.escape(cell.source)
        tag = "div style='white-space:pre-wrap'" if cell.cell_type == "markdown" else "pre"
        parts.append(f"<{tag}>{src}</{tag.split()[0]}>")
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "image/png" in data:
                parts.append(f"<img src='data:image/png;base64,{data['image/png']}'>")
            elif "text/html" in data:
                parts.append("".join(data["text/html"]))
            elif out.get("output_type") == "error":
                tb = ansi.sub("", "\n".join(out.get("traceback", [])))
                parts.append(f"<pre style='color:#c62828'>{html.escape(tb)}</pre>")
            else:
                text = out.get("text") or data.get("text/plain", "")
                parts.append(f"<pre>{html.escape(''.join(text))}</pre>")
    return "\n".join(parts + ["</body>"])


def write_index(series: Path, meta: dict[str, Any]) -> Path:
    """Write ``series.json`` and ``index.html`` (links to notebooks, exports and figures)."""
    (series / "series.json").write_text(json.dumps(meta, indent=1))
    colors = {"ok": "#2e7d32", "failed": "#c62828", "timeout": "#c62828", "not run": "#757575"}
    rows = []
    for st in meta["stages"]:
        name, status = st["name"], st["status"]
        links = []
        for key, label in (("notebook", "executed notebook"), ("html", "HTML")):
            if st.get(key):
                links.append(f"<a href='{name}/{st[key]}'>{label}</a>")
        if status != "not run":
            links.append(f"<a href='{name}/parameters.json'>parameters</a>")
            links.append(f"<a href='{name}/papermill.log'>log</a>")
        figs = " ".join(f"<a href='{name}/{f}'><img src='{name}/{f}' height='90' title='{f}'>"
                        "</a>" for f in st.get("figures", []))
        detail = "" if status == "ok" else html.escape(st.get("error", ""))
        secs = f"{st['seconds']:.1f} s" if "seconds" in st else ""
        rows.append(f"<tr><td><b>{name}</b></td><td style='color:{colors.get(status, '#000')}'>"
                    f"{status} {detail}</td><td>{secs}</td><td>{' · '.join(links)}</td>"
                    f"<td>{figs}</td></tr>")
    total = sum(st.get("seconds", 0) for st in meta["stages"])
    page = f"""<!doctype html><meta charset="utf-8"><title>envace-lite notebooks</title>
<body style="font-family:sans-serif;max-width:1100px">
<h1>envace-lite notebook series</h1>
<p>profile <b>{meta['profile']}</b> · seed {meta['seed']} · commit {meta['commit']} · started
{meta['started']} · total {total:.1f} s · per-cell timeout {meta['cell_timeout']} s, per notebook
{meta['timeout']} s</p>
<table border="1" cellpadding="6" style="border-collapse:collapse">
<tr><th>notebook</th><th>status</th><th>wall time</th><th>files</th><th>figures</th></tr>
{''.join(rows)}
</table></body>"""
    path = series / "index.html"
    path.write_text(page, encoding="utf-8")
    return path
