"""The report as a list of blocks, written as GitHub markdown and as one self-contained HTML page.

Both writers read the same blocks, so report.md and report.html say the same thing: headings,
paragraphs (with ``code`` and **bold** inline), comparison tables (:class:`~jemeval.reports.tables.Table`,
best values in bold), figures (linked PNGs in markdown; inlined as base64 PNG in HTML, so the page
is one file that opens anywhere) and folded code blocks (the provenance).
"""
from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from pathlib import Path

from jemeval.reports.tables import Table


@dataclass
class Heading:
    level: int
    text: str


@dataclass
class Para:
    text: str


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Figure:
    path: Path  # the PNG file
    link: str  # its path relative to the report
    caption: str


@dataclass
class Folded:
    summary: str
    text: str
    lang: str = ""


Block = Heading | Para | Bullets | Table | Figure | Folded


# -- markdown --------------------------------------------------------------------------------------
def _md_cell(text: str, bold: bool) -> str:
    text = text.replace("|", "\\|")
    return f"**{text}**" if bold and text else text


def markdown_table(table: Table) -> str:
    head = "| " + " | ".join(_md_cell(c, False) for c in table.columns) + " |"
    rule = "|" + "|".join("---" if i < table.label_columns else "---:" for i in range(len(table.columns))) + "|"
    body = ["| " + " | ".join(_md_cell(c, b) for c, b in zip(row, best)) + " |"
            for row, best in zip(table.rows, table.best)]
    title = [f"*{table.title}*", ""] if table.title else []
    return "\n".join([*title, head, rule, *body])


def to_markdown(blocks: list[Block]) -> str:
    parts = []
    for b in blocks:
        if isinstance(b, Heading):
            parts.append("#" * b.level + " " + b.text)
        elif isinstance(b, Para):
            parts.append(b.text)
        elif isinstance(b, Bullets):
            parts.append("\n".join(f"- {item}" for item in b.items))
        elif isinstance(b, Table):
            parts.append(markdown_table(b))
        elif isinstance(b, Figure):
            parts.append(f"![{b.caption}]({b.link})")
        else:
            parts.append(f"<details><summary>{html.escape(b.summary)}</summary>\n\n```{b.lang}\n{b.text}\n```\n"
                         "</details>")
    return "\n\n".join(parts) + "\n"


# -- HTML ------------------------------------------------------------------------------------------
STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #1f2328; line-height: 1.5; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.92em; }
th, td { border: 1px solid #d0d7de; padding: 0.25em 0.7em; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:nth-child(even) td { background: #fafbfc; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.4em 0 1.2em; }
code { background: #f6f8fa; padding: 0.1em 0.3em; border-radius: 4px; }
pre { background: #f6f8fa; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
.title { font-style: italic; margin-bottom: 0.2em; }
"""


def inline_html(text: str) -> str:
    """Escape ``text`` and turn its `code` and **bold** spans into HTML."""
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)


def html_table(table: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    rows = []
    for row, best in zip(table.rows, table.best):
        cells = []
        for i, (text, bold) in enumerate(zip(row, best)):
            value = f"<strong>{html.escape(text)}</strong>" if bold else html.escape(text)
            cells.append(f"<td>{value}</td>" if i < table.label_columns else f'<td class="num">{value}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    title = f'<div class="title">{html.escape(table.title)}</div>' if table.title else ""
    return f"{title}<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def inline_png(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def to_html(blocks: list[Block], title: str) -> str:
    parts = []
    for b in blocks:
        if isinstance(b, Heading):
            parts.append(f"<h{b.level}>{inline_html(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            parts.append(f"<p>{inline_html(b.text)}</p>")
        elif isinstance(b, Bullets):
            parts.append("<ul>" + "".join(f"<li>{inline_html(item)}</li>" for item in b.items) + "</ul>")
        elif isinstance(b, Table):
            parts.append(html_table(b))
        elif isinstance(b, Figure):
            parts.append(f'<figure><img src="{inline_png(b.path)}" alt="{html.escape(b.caption)}">'
                         f"<figcaption>{html.escape(b.caption)}</figcaption></figure>")
        else:
            parts.append(f"<details><summary>{html.escape(b.summary)}</summary><pre>{html.escape(b.text)}</pre>"
                         "</details>")
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>{STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n")
