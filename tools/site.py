"""``make site``: the course as a static website, built offline from the notebooks' stored outputs.

Nothing is executed: the pages show exactly the outputs and figures that ``make test`` checks. The build
stages the pages in ``build/site-src/`` and runs MkDocs (``mkdocs.yml``: the Material theme, notebooks
rendered by mkdocs-jupyter) in strict mode, so a warning fails it; the site lands in ``build/site/``.
Everything the pages need ships inside that folder: the theme, its search (lunr, run in the browser), and
MathJax 2 for the formulas, copied from the ``jupyter-server-mathjax`` package. Fonts are the reader's own.

The staged pages:

- ``index.md``, the landing page: the syllabus, made from ``course.toml`` (:func:`tools.syllabus.syllabus_table`);
- one page per lesson, from a copy of its ``.ipynb`` with a download link at the top, an anchor on each
  key term's first use and its links to other lessons pointing at their pages; the untouched ``.ipynb`` is
  published in ``downloads/``;
- ``glossary.md``, every key term with its Chinese term, collected from the lessons (:func:`key_terms`),
  each linking to where it is taught;
- ``run_locally.md``, how to get the course (``downloads/torch-course.zip``: all of it but ``solutions/``) and
  run it, with the README's two commands and its guide to the exercises.

The exercises are published as the learner meets them, without solutions: those live in ``solutions/``,
which the build never reads. Used by no notebook; ``tests/test_site.py`` and ``tests/browser/test_site.py``
check it.

Command line::

    python -m tools.site                # make site: stage, then mkdocs build --strict into build/site/
    python -m tools.site --terms [FILE ...]  # print the glossary collected from lessons (.ipynb or src/.py)
"""

from __future__ import annotations

import base64
import html
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import jupytext
import nbformat

from tools.syllabus import README, colab_url, run_seconds, shown_seconds, syllabus_table
from utils.paths import REPO_ROOT
from utils.syllabus import course
from utils.syllabus import lessons as course_lessons

CONFIG = REPO_ROOT / "mkdocs.yml"
STAGE = REPO_ROOT / "build" / "site-src"
SITE = REPO_ROOT / "build" / "site"
CSS = Path(__file__).with_name("site.css")
JS = Path(__file__).with_name("site.js")
LANDING_FIGURE = ("04_mnist_cnn.ipynb", "landing.png")
"""The landing page's picture: the first figure of this lesson (a batch of MNIST digits), saved under this name."""
MATHJAX_CONFIG = """\
// The course's MathJax settings (tools/site.py): jupyter-server-mathjax ships the STIX-Web fonts only.
MathJax.Hub.Config({
  "HTML-CSS": {availableFonts: [], preferredFont: null, imageFont: null, webFont: "STIX-Web"},
  SVG: {font: "STIX-Web"},
});
MathJax.Ajax.loadComplete("[MathJax]/config/local/course.js");
"""
"""Loaded by the lesson pages after MathJax's own configuration (``custom_mathjax_url`` in ``mkdocs.yml``)."""

HAN = r"[\u3400-\u9fff]"
KEY_TERM = re.compile(
    # **leaf tensor** (叶子节点) — also with a remark after the Chinese: **exponent** (指数; how big: the range)
    rf"\*\*(?P<en1>[^*\n]+?)\*\*\s*\((?P<zh1>{HAN}[^)\n]*)\)"
    # **leaf tensor (叶子节点)**
    rf"|\*\*(?P<en2>[^*\n(]+?)\s*\((?P<zh2>{HAN}[^)\n]*)\)\*\*"
)
"""A key term at its first use, as the course writes it: the English in bold, the Chinese in parentheses."""


LESSON_LINK = re.compile(r"\]\((\d\d_\w+)\.ipynb(#[^)\s]*)?\)")
"""A lesson's link to another lesson, ``[notebook 04](04_mnist_cnn.ipynb)``: on the site it leads to that page
(nbconvert renders the lessons' Markdown, and leaves links as they are)."""


@dataclass
class Term:
    en: str
    zh: str
    lesson: str  # the notebook's file name, 07_mixed_precision.ipynb
    anchor: str  # the id given to its first use on that lesson's page


def chinese(remark: str) -> str:
    """The Chinese term of a parenthesis, without a remark after it: 指数; how big → 指数."""
    return re.split(r"[;,:；，：]", remark, maxsplit=1)[0].strip()


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "term"


def lessons() -> list[Path]:
    return [x.notebook for x in course_lessons()]


def _git(*args: str) -> bytes | None:
    """The output of a git command in the course's folder; None outside a git checkout (an unzipped course)."""
    try:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def committed(path: Path) -> bytes:
    """A file of the course as the last commit holds it (what a teacher published), or as it is on disk when the
    course is not a git checkout. Work in progress (a teacher's own exercise answers) is never published."""
    rel = path.resolve().relative_to(REPO_ROOT).as_posix()
    if _git("rev-parse", "--verify", "--quiet", "HEAD") is None:
        return path.read_bytes()
    data = _git("show", f"HEAD:{rel}")
    if data is None:
        raise FileNotFoundError(f"{rel} is not committed: commit it, or leave it out of the course")
    return data


def uncommitted() -> list[str]:
    """The files of the course whose working copy differs from the last commit (left out of the site)."""
    out = _git("status", "--porcelain", "--untracked-files=no")
    return sorted(line[3:] for line in (out or b"").decode().splitlines() if line.strip())


def read_lesson(path: Path) -> nbformat.NotebookNode:
    return nbformat.reads(committed(path).decode("utf-8"), as_version=4)


def key_terms(notebooks: list[Path]) -> dict[str, list[Term]]:
    """{Chinese term: its uses, first per lesson, in course order}. The first is where it is taught."""
    terms: dict[str, list[Term]] = {}
    for path in notebooks:
        used: set[str] = set()  # anchors are unique within a lesson, so that one lesson's edits move no other's
        # a lesson's .ipynb, or its jupytext source (``python -m tools.site --terms notebooks/src/*.py``)
        nb = jupytext.read(path) if path.suffix == ".py" else read_lesson(path)
        for cell in nb.cells:
            if cell.cell_type != "markdown":
                continue
            for m in KEY_TERM.finditer(cell.source):
                en = (m["en1"] or m["en2"]).strip()
                zh = chinese(m["zh1"] or m["zh2"])
                uses = terms.setdefault(zh, [])
                if any(t.lesson == path.with_suffix(".ipynb").name for t in uses):
                    continue
                anchor = base = "term-" + slug(en.strip("`"))
                n = 1
                while anchor in used:
                    n += 1
                    anchor = f"{base}-{n}"
                used.add(anchor)
                uses.append(Term(en, zh, path.with_suffix(".ipynb").name, anchor))
    return terms


def stage_lesson(path: Path, terms: dict[str, list[Term]], dest: Path) -> None:
    """The lesson's page (its notebook with a download link and the key terms' anchors) and its download."""
    nb = read_lesson(path)
    placed: set[str] = set()  # the anchors already put on this page
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = LESSON_LINK.sub(r"](\1.html\2)", _anchored(cell.source, path.name, terms, placed))
    lesson = next(x for x in course_lessons() if x.ipynb == path.name)
    seconds = run_seconds(lesson)
    timing = f"Study time about {lesson.study_minutes} min" + (
        f"; its cells ran in {shown_seconds(seconds)} s on a 2-core CPU" if seconds is not None else ""
    )
    colab = colab_url(lesson)
    alone = (
        f' (opened alone, its first cell fetches the rest of the course) · <a href="{colab}">Open in Colab</a>'
        if colab
        else f' (it runs inside <a href="downloads/{COURSE_ZIP}">the course</a>)'
    )
    link = nbformat.v4.new_markdown_cell(
        f'<p class="download">{timing}. Download this lesson: <a href="downloads/{path.name}" download>'
        f'{path.name}</a>{alone} · <a href="run_locally.html">run it yourself</a></p>'
    )
    # after the title, so that the page's title stays the notebook's first heading
    title, _, rest = nb.cells[0].source.partition("\n")
    nb.cells[0].source = title
    nb.cells[1:1] = [link, nbformat.v4.new_markdown_cell(rest.strip())]
    nbformat.write(nb, dest / path.name)
    (dest / "downloads" / path.name).write_bytes(committed(path))


def _anchored(source: str, lesson: str, terms: dict[str, list[Term]], placed: set[str]) -> str:
    """``source`` with an anchor before each key term whose first use in ``lesson`` it holds."""

    def mark(m: re.Match) -> str:
        zh = chinese(m["zh1"] or m["zh2"])
        for t in terms.get(zh, []):
            if t.lesson == lesson and t.anchor not in placed:
                placed.add(t.anchor)
                return f'<a id="{t.anchor}" class="key-term"></a>{m[0]}'
        return m[0]

    return KEY_TERM.sub(mark, source)


def glossary_page(terms: dict[str, list[Term]], titles: dict[str, str] | None = None) -> str:
    """The glossary's Markdown; ``titles`` ({file: lesson title}) names each lesson link's target on hover."""
    titles = titles or {}

    def link(t: Term) -> str:
        title = f' "{t.lesson[:2]} · {titles[t.lesson]}"' if t.lesson in titles else ""
        return f"[{t.lesson[:2]}]({t.lesson}#{t.anchor}{title})"

    rows = [
        f"| {uses[0].en} | {html.escape(zh)} | {link(uses[0])} | {', '.join(link(t) for t in uses[1:])} |"
        for zh, uses in sorted(terms.items(), key=lambda kv: kv[1][0].en.strip("`*").lower())
    ]
    return "\n".join(
        [
            "# Glossary (术语表)",
            "",
            f"The {len(terms)} key terms of the course, each with its Chinese term, in alphabetical order. The lesson",
            "number links to where the term is first taught; *also in* lists the later lessons that take it up again.",
            "The build collects them from the lessons, where each key term is written in bold at its first use,",
            "with its Chinese term beside it.",
            "",
            "| term | 中文 | taught in | also in |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    )


def first_figure(path: Path) -> bytes:
    """The first PNG figure stored in a lesson."""
    for cell in read_lesson(path).cells:
        for out in cell.get("outputs", []):
            if "image/png" in out.get("data", {}):
                return base64.b64decode(out["data"]["image/png"])
    raise ValueError(f"{path.name} has no figure for the landing page")


def index_page() -> str:
    table, notes = syllabus_table()
    first = course_lessons()[0]
    count, version, repo = len(course_lessons()), course().pytorch, course().repository
    ask = (
        f"The course's source is at [{repo}]({repo}); ask a question or report a mistake in its "
        f"[issues]({repo}/issues)."
        if repo
        else "Questions and mistakes go to whoever gave you this site (the course names no public repository yet)."
    )
    return f"""# torch-course

**Learn what PyTorch does, not only how to call it**: {count} lessons that run on a laptop's CPU, from tensors to
training on several processes, each ending with exercises that check your answer and tell you what to re-read.

[Start with {first.nn} · {first.title} →]({first.ipynb}){{ .md-button .md-button--primary }}
[Run it yourself](run_locally.md){{ .md-button }}

<figure class="landing-figure" markdown>
![A batch of handwritten digits from lesson 04](assets/{LANDING_FIGURE[1]})
<figcaption>Lesson 04 teaches a small convolutional network to read digits like these, on a CPU.</figcaption>
</figure>

The lessons teach PyTorch {version}, in order: each builds on the ones before it. Every output and figure on these
pages is the one stored in the notebook and re-checked by the course's tests. The prose is English, with the
Chinese term beside each key term at its first use; the [glossary (术语表)](glossary.md) lists them all. {ask}

{table}

The study time is the time to read, run and think through a lesson once and do its exercises; the run time is
how long all its cells took on the 2-core course machine (one thread).{notes}
"""


COURSE_ZIP = "torch-course.zip"
"""The course as ``make site`` found it (the files git tracks) less ``solutions/``, in ``downloads/``: the
lessons import ``utils/`` and read ``data/``, so a lesson's ``.ipynb`` alone does not run."""


def run_locally_page(readme: str) -> str:
    """How a reader of the site gets the course and runs it: the README's two commands, and its exercises' part
    for learners (up to its part for teachers)."""
    commands = re.search(r"## Two commands\n\n(```bash\n.*?```)", readme, re.S)
    learners = re.search(r"\*\*For learners\.\*\* (.*?)\n\*\*For teachers\.\*\*", readme, re.S)
    if not (commands and learners):
        raise ValueError("README.md: no '## Two commands' code block, or no '**For learners.**' paragraph")
    alone = (
        "A lesson's own `.ipynb` (the download link at the top of each lesson) also runs alone, in any Jupyter "
        "with Python 3.10 or newer, or in Colab: its first cell fetches the rest of the course (its `utils/` "
        f"package, its `data/` and the packages it pins) from {course().repository}."
        if course().repository
        else "A lesson's own `.ipynb` (the download link at the top of each lesson) runs inside the course only: "
        "every lesson imports the course's `utils/` package and reads its `data/` (this copy of the course names "
        "no repository its first cell could fetch them from)."
    )
    return f"""# Run the course yourself

The pages of this site are the lessons with their stored outputs; to run the code, change it and do the
exercises, run the course on your own machine. It needs Python 3.10 to 3.14, `make` and access to the Python
package registry (it installs PyTorch and JupyterLab into its own `.venv`); no GPU.

## 1. Get the course

Download [the course](downloads/{COURSE_ZIP}) (everything but the teachers' solutions) and unzip it. {alone}

## 2. Two commands

In the unzipped `torch-course/` folder:

{commands[1]}

`make lab` opens JupyterLab on the start page, which lists the lessons in order. Without `make` (Windows),
`python tools/course.py lab` and `python tools/course.py test` do the same. The course's `README.md` says more,
and its `CONTRIBUTING.md` how each notebook is checked.

## 3. Exercises (练习)

{_site_links(learners[1].strip())}
"""


def _site_links(markdown: str) -> str:
    """The README's links as the site has them: a lesson's to its page, other repository files as plain names."""

    def fix(m: re.Match) -> str:
        text, target = m[1], m[2]
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            return m[0]
        if lesson := re.fullmatch(r"notebooks/(\d\d_\w+\.ipynb)", target):
            return f"[{text}]({lesson[1]})"
        return text if text.startswith("`") else f"`{target}`" if text == target else text

    return re.sub(r"\[([^]]+)\]\(([^)\s]+)\)", fix, markdown)


def course_files() -> list[str]:
    """The course's files: those of the last commit, or, without git, every file but the generated ones."""
    if (out := _git("ls-tree", "-r", "--name-only", "-z", "HEAD")) is not None:
        return sorted(f for f in out.decode().split("\0") if f)
    skip = {".git", "build", "runs", "__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".ruff_cache"}
    return sorted(
        p.relative_to(REPO_ROOT).as_posix()
        for p in REPO_ROOT.rglob("*")
        if p.is_file()
        and not skip.intersection(p.relative_to(REPO_ROOT).parts)
        and not p.relative_to(REPO_ROOT).parts[0].startswith(".venv")
    )


def write_course_zip(dest: Path) -> None:
    """The course as handed out to learners: every committed file but the teachers' ``solutions/``."""
    executable = {
        line.split("\t", 1)[1]
        for line in (_git("ls-tree", "-r", "HEAD") or b"").decode().splitlines()
        if line.startswith("100755")
    }
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as z:
        for name in course_files():
            if not name.startswith("solutions/"):
                info = zipfile.ZipInfo(f"torch-course/{name}", date_time=(2026, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = (0o755 if name in executable else 0o644) << 16
                z.writestr(info, committed(REPO_ROOT / name))


def copy_mathjax(dest: Path) -> None:
    import jupyter_server_mathjax

    static = Path(jupyter_server_mathjax.__file__).parent / "static"
    shutil.copytree(static, dest, ignore=shutil.ignore_patterns("*.md"))
    (dest / "config" / "local").mkdir(parents=True, exist_ok=True)
    (dest / "config" / "local" / "course.js").write_text(MATHJAX_CONFIG, encoding="utf-8")


def stage(dest: Path = STAGE, mathjax: bool = True) -> dict[str, list[Term]]:
    """Write the site's pages into ``dest`` (emptied first); return the key terms. ``mathjax=False`` leaves
    MathJax out (it comes with the site's extra packages; the unit tests stage without them)."""
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "downloads").mkdir(parents=True)
    notebooks = lessons()
    terms = key_terms(notebooks)
    for path in notebooks:
        stage_lesson(path, terms, dest)
    readme = README.read_text(encoding="utf-8")
    (dest / "index.md").write_text(index_page(), encoding="utf-8")
    titles = {x.ipynb: x.short for x in course_lessons()}
    (dest / "glossary.md").write_text(glossary_page(terms, titles), encoding="utf-8")
    (dest / "run_locally.md").write_text(run_locally_page(readme), encoding="utf-8")
    (dest / "assets").mkdir()
    shutil.copy2(CSS, dest / "assets" / CSS.name)
    shutil.copy2(JS, dest / "assets" / "course.js")
    (dest / "assets" / LANDING_FIGURE[1]).write_bytes(first_figure(REPO_ROOT / "notebooks" / LANDING_FIGURE[0]))
    if mathjax:  # and the course's zip: both are files for the built site, not for the unit tests
        copy_mathjax(dest / "assets" / "mathjax")
        write_course_zip(dest / "downloads" / COURSE_ZIP)
    return terms


def build() -> int:
    start = time.perf_counter()
    if left_out := uncommitted():
        print(
            f"make site: publishing the last commit; {len(left_out)} changed file(s) of the working copy are left "
            f"out (commit them to publish them): {', '.join(left_out[:8])}{' ...' if len(left_out) > 8 else ''}"
        )
    terms = stage()
    mkdocs = [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "--config-file", str(CONFIG)]
    # Material for MkDocs prints a banner on every build: it reaches end of life on 5 May 2027 (README, "The website")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    if rc := subprocess.run(mkdocs, cwd=REPO_ROOT, env=env).returncode:
        print(f"make site: mkdocs failed (exit {rc}); the pages it was given are in {STAGE.relative_to(REPO_ROOT)}/")
        return rc
    # Material's 404 page links its assets from the site's root ("/assets/..."), which breaks on a host that
    # serves the site from a folder (a GitHub Pages project site): without it, the host shows its own.
    (SITE / "404.html").unlink(missing_ok=True)
    pages = sorted(SITE.glob("*.html"))
    print(
        f"make site: {len(pages)} pages ({len(lessons())} lessons, {len(terms)} glossary terms) in "
        f"{SITE.relative_to(REPO_ROOT)}/ in {time.perf_counter() - start:.0f} s. Open {SITE.relative_to(REPO_ROOT)}"
        "/index.html, or serve it: python -m http.server -d build/site"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--terms"]:  # the glossary's rows only, from the given notebooks or sources
        print(glossary_page(key_terms([Path(a) for a in argv[1:]] or lessons())))
        return 0
    return build()


if __name__ == "__main__":
    sys.exit(main())
