"""MkDocs hooks of the course's website (``hooks:`` in ``mkdocs.yml``; ``make site`` runs them).

mkdocs-jupyter makes a lesson page's table of contents from a Markdown rendering of the notebook whose
heading ids differ from those of the page itself wherever a heading holds inline code
(``2. A `Dataset` of your own`` gives ``#2-a-of-your-own`` in the contents but
``id="2-a-dataset-of-your-own-..."`` on the page), so those links led nowhere and their titles lost their
code. :func:`on_page_content` rebuilds the contents of every lesson page from the headings that are really
on it.

The pages are English (``<html lang="en">``), so a browser draws their Chinese terms with whatever CJK font it
falls back to for English text, often a Japanese one, whose glyphs differ from Chinese ones. :func:`on_post_page`
marks each run of Chinese text as ``<span lang="zh-Hans">``: browsers then choose a Simplified Chinese font
(Noto Sans CJK SC, PingFang SC, Microsoft YaHei) and screen readers read it as Chinese. It also drops
mkdocs-jupyter's Mermaid loader, which would import mermaid.js from a CDN (no lesson has a Mermaid diagram), so
that no page refers to another host. :func:`on_config` makes the site's navigation from ``course.toml``.
Used by no notebook.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

TOC_LEVELS = (1, 2)
"""The heading levels listed in a lesson's table of contents: its title and its numbered sections."""


class _Headings(HTMLParser):
    """Collects (level, id, text) of the page's h1/h2 headings, without their "¶" permalink."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[int, str, str]] = []
        self._open: tuple[int, str] | None = None
        self._text: list[str] = []
        self._in_permalink = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if len(tag) == 2 and tag[0] == "h" and tag[1].isdigit() and int(tag[1]) in TOC_LEVELS and attrs.get("id"):
            self._open, self._text = (int(tag[1]), attrs["id"]), []
        elif self._open and tag == "a" and "anchor-link" in (attrs.get("class") or ""):
            self._in_permalink = True

    def handle_endtag(self, tag):
        if self._in_permalink and tag == "a":
            self._in_permalink = False
        elif self._open and tag == f"h{self._open[0]}":
            self.found.append((*self._open, " ".join("".join(self._text).split())))
            self._open = None

    def handle_data(self, data):
        if self._open and not self._in_permalink:
            self._text.append(data)


def toc_tokens(html: str) -> list[dict]:
    """The page's headings as the nested tokens ``mkdocs.structure.toc.get_toc`` takes."""
    parser = _Headings()
    parser.feed(html)
    tokens: list[dict] = []
    for level, anchor, text in parser.found:
        token = {"level": level, "id": anchor, "name": text, "children": []}
        parent = tokens[-1] if tokens and tokens[-1]["level"] < level else None
        (parent["children"] if parent else tokens).append(token)
    return tokens


def on_config(config):
    """The navigation: the landing page, the lessons in the manifest's order, the glossary, running it yourself."""
    from utils.syllabus import course, lessons

    config["site_description"] = (
        f"An executable PyTorch {course().pytorch} course, from tensors to multi-process training"
    )
    if course().repository:  # the repository's link in the header
        config["repo_url"] = course().repository
    config["nav"] = [
        {"Home": "index.md"},
        {"Lessons": [x.ipynb for x in lessons()]},
        "glossary.md",
        "run_locally.md",
    ]
    return config


def on_page_content(html, page, config, files):
    from mkdocs.structure.toc import get_toc  # here: the tests import this module without MkDocs installed

    if page.file.src_uri.endswith(".ipynb"):
        page.toc = get_toc(toc_tokens(html))
    return html


CHINESE = re.compile(r"[\u3400-\u9fff][\u3000-\u303f\u3400-\u9fff\uff00-\uffef]*")
"""A run of Chinese: Han characters, with the CJK punctuation and full-width forms inside it."""
TAG = re.compile(r"""<(?:[^>"']|"[^"]*"|'[^']*')*>""")
"""An HTML tag, or comment, whose quoted attribute values may hold ``>``."""
RAW = re.compile(r"<(title|script|style|textarea|svg|math)\b.*?</\1\s*>", re.S | re.I)
"""Elements whose text must not get an HTML span: raw text (a span would show, or break a script), SVG and MathML."""
MERMAID_LOADER = re.compile(r"<script type=\"module\">(?:(?!</script>).)*?mermaid(?:(?!</script>).)*?</script>", re.S)
"""mkdocs-jupyter's loader of Mermaid diagrams, which would import mermaid.js from a CDN: no lesson has one."""


def mark_chinese(html: str) -> str:
    """``html`` with each run of Chinese in its text (not in tags, attributes, raw-text elements, SVG or MathML)
    in a ``<span lang="zh-Hans">``."""

    def text(part: str) -> str:
        pieces = TAG.split(part)  # text, tag, text, ...
        tags = TAG.findall(part)
        marked = [CHINESE.sub(r'<span lang="zh-Hans">\g<0></span>', t) for t in pieces]
        return "".join(x for pair in zip(marked, [*tags, ""]) for x in pair)

    out, last = [], 0
    for m in RAW.finditer(html):
        out += [text(html[last : m.start()]), m[0]]
        last = m.end()
    return "".join([*out, text(html[last:])])


def on_post_page(output, page, config):
    return mark_chinese(MERMAID_LOADER.sub("", output))
