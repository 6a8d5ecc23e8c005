"""The pages made from the course manifest (``course.toml``, read by :mod:`utils.syllabus`).
Run by ``make sync`` and ``make execute`` (:mod:`tools.notebooks`), ``make site`` (:mod:`tools.site`) and the tests.

Generated, never edited by hand (``tests/test_syllabus.py`` fails when one drifts, and ``make sync`` rewrites them):

* the README's syllabus, between :data:`BEGIN` and :data:`END`;
* the start page JupyterLab opens on, ``notebooks/00_start_here.md``, with each lesson's measured run time, read
  from its notebook's metadata (where ``make execute`` writes it, and nowhere else);
* the solutions index, ``solutions/README.md``, with as many exercise columns as the longest lesson has;
* each lesson's setup cell, its first code cell (:func:`setup_cell`): it does nothing in the course, and opened
  alone it fetches the course from the repository that ``course.toml`` names (:mod:`tools.opened_alone`).

Command line::

    python -m tools.syllabus          # rewrite them (make sync does it too)
    python -m tools.syllabus --check  # list the ones that are out of date
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from utils.paths import NOTEBOOKS_DIR, REPO_ROOT
from utils.syllabus import Lesson, course, lessons

README = REPO_ROOT / "README.md"
START_PAGE = NOTEBOOKS_DIR / "00_start_here.md"
SOLUTIONS_INDEX = REPO_ROOT / "solutions" / "README.md"
BEGIN = "<!-- syllabus: generated from course.toml by `make sync`; edit course.toml, not this table -->"
END = "<!-- end of syllabus -->"
METADATA_KEY = "torch_course"
"""The notebook metadata that ``make execute`` writes: ``source_sha256`` and ``run_seconds``."""


def shown_seconds(seconds: float) -> int:
    """How a measured run time is shown: to 5 s below 100 s, to 10 s above (runs vary by about 10%)."""
    step = 5 if seconds < 100 else 10
    return max(step, step * round(seconds / step))


def run_seconds(lesson: Lesson) -> float | None:
    """The run time ``make execute`` measured for the lesson's notebook (None before its first run)."""
    try:
        meta = json.loads(lesson.notebook.read_text(encoding="utf-8")).get("metadata", {})
    except (OSError, ValueError):
        return None
    seconds = meta.get(METADATA_KEY, {}).get("run_seconds")
    return seconds if isinstance(seconds, (int, float)) else None


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


COLAB_BRANCH = "main"
"""The branch Colab opens a lesson from (its links name one)."""


def colab_url(lesson: Lesson) -> str | None:
    """ "Open in Colab" for a lesson, when course.toml names a GitHub repository (None otherwise)."""
    repository = course().repository.rstrip("/").removesuffix(".git")
    if not repository.startswith("https://github.com/"):
        return None
    path = repository.removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{path}/blob/{COLAB_BRANCH}/notebooks/{lesson.ipynb}"


def with_colab(link: str, lesson: Lesson) -> str:
    """A lesson's link (its notebook: a click opens or downloads it), followed by "Colab" when there is one."""
    colab = colab_url(lesson)
    return link + (f" · [Colab]({colab})" if colab else "")


def readme_block() -> str:
    """The README's syllabus: links to the notebooks, what each teaches, study time, what changes on a GPU."""
    rows = [
        f"| {x.nn} | {with_colab(f'[{x.short}](notebooks/{x.ipynb})', x)} | {_cell(x.teaches)} "
        f"| {x.study_minutes} min | {_cell(x.gpu)} |"
        for x in lessons()
    ]
    return "\n".join(
        [
            BEGIN,
            f"The lessons teach PyTorch {course().pytorch}, in this order:",
            "",
            "| # | notebook | what it teaches | study time | on a GPU |",
            "|---|---|---|---|---|",
            *rows,
            END,
        ]
    )


def with_readme_block(readme: str) -> str:
    """``readme`` with the text between its markers replaced by :func:`readme_block`."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README.md: no syllabus markers; put {BEGIN!r} and {END!r} where the syllabus goes")
    return readme[:start] + readme_block() + readme[end + len(END) :]


def run_time(lesson: Lesson, marks: dict[str, str]) -> str:
    """The run-time cell of a lesson: ``10 s``, with a footnote mark when the lesson has a run note."""
    seconds = run_seconds(lesson)
    shown = "not run yet" if seconds is None else f"{shown_seconds(seconds)} s"
    if lesson.run_note:
        marks.setdefault(lesson.run_note, "¹²³⁴⁵⁶⁷⁸⁹"[len(marks)])
        shown += marks[lesson.run_note]
    return shown


def syllabus_table(link=lambda x: x.ipynb) -> tuple[str, str]:
    """The lessons as a Markdown table with their run times, and its footnotes. ``link`` gives each lesson's
    target (the notebook's file name: relative to ``notebooks/`` and to the website's pages)."""
    marks: dict[str, str] = {}
    rows = [
        f"| {x.nn} | {with_colab(f'[{x.short}]({link(x)})', x)} | {_cell(x.teaches)} | {x.study_minutes} min "
        f"| {run_time(x, marks)} |"
        for x in lessons()
    ]
    table = "\n".join(["| # | lesson | what it teaches | study time | run time |", "|---|---|---|---|---|", *rows])
    notes = "".join(f"\n\n{mark} {note[0].upper()}{note[1:]}." for note, mark in marks.items())
    return table, notes


def start_page() -> str:
    """The start page's Markdown, made from ``course.toml`` and the notebooks' measured run times."""
    table, notes = syllabus_table()
    return f"""# Start here

{len(lessons())} lessons, in order: each builds on the ones before it. Open one, read it from the top and run each
cell with Shift+Enter (or Run ▸ Run All Cells). Its first cell says what you will learn and what you should
know; its last section holds exercises that check your answers and give a hint when they are wrong.

{table}

The study time is the time to read, run and think through a lesson once and do its exercises; the run time is
how long all its cells took on the 2-core course machine (one thread).{notes}

<!-- Made by `make sync` from course.toml and the notebooks' measured run times: edit course.toml, not this. -->
"""


def solutions_index() -> str:
    """``solutions/README.md``: a row per lesson, a column per exercise (as many as the longest lesson has)."""
    width = max(len(x.exercises) for x in lessons())
    head = "| notebook | " + " | ".join(str(i) for i in range(1, width + 1)) + " |"
    rows = [
        f"| [{x.nn} {x.short}]({x.stem}.md) | "
        + " | ".join([f"{_cell(e.title)} ({e.kind})" for e in x.exercises] + [""] * (width - len(x.exercises)))
        + " |"
        for x in lessons()
    ]
    return "\n".join(
        [
            "# Solutions (答案) — for teachers",
            "",
            "One file per notebook: the reference solution of each exercise, why it is right, and the usual wrong "
            "answers with",
            "the hint each one gets. `make test` puts every solution and every wrong answer in place of its stub "
            "and checks what",
            "the learner would read (`tests/test_exercises.py`). To hand out the course without solutions, delete "
            "this folder",
            "from your copy; the notebooks do not need it.",
            "",
            head,
            "|---|" + "---|" * width,
            *rows,
            "",
            "<!-- Made by `make sync` from course.toml: edit the exercises there, not this table. -->",
            "",
        ]
    )


SETUP_FIRST_LINE = (
    "# Opened alone? (单独打开) In the course's own folder this cell does nothing. Opened alone (in Colab, or"
)


def setup_cell() -> str:
    """A lesson's first code cell: nothing in the course; opened alone, it fetches the course and runs in it
    (:mod:`tools.opened_alone`), from the repository that course.toml names."""
    repository = course().repository
    return f"""{SETUP_FIRST_LINE}
# downloaded without the rest of the course), it fetches the course (its helpers, data and pinned packages) from
# COURSE and runs this notebook inside it.
try:
    import utils.syllabus  # noqa: F401 - the course's helpers: found when this notebook runs in its course
except ModuleNotFoundError:
    import os
    from pathlib import Path
    from urllib.request import urlopen

    COURSE = os.environ.get("TORCH_COURSE_REPOSITORY", {json.dumps(repository)}).rstrip("/").removesuffix(".git")
    beside = Path.cwd().parent / "tools" / "opened_alone.py"  # the course is here, but not installed
    if not (beside.is_file() or COURSE):
        raise ModuleNotFoundError(
            "opened without its course, which names no repository to fetch it from: set the environment variable "
            "TORCH_COURSE_REPOSITORY to the course's location (a GitHub address), or get the whole course"
        ) from None
    raw = "/raw/HEAD" if COURSE.startswith("https://github.com/") else ""
    code = beside.read_bytes() if beside.is_file() else urlopen(f"{{COURSE}}{{raw}}/tools/opened_alone.py").read()
    exec(code, {{"__name__": "opened_alone", "COURSE": COURSE}})
"""


def with_setup_cell(source: str) -> str:
    """A lesson's jupytext source with its setup cell as :func:`setup_cell` writes it (put right after the
    lesson's first cell when missing)."""
    cells = re.split(r"(?m)^(?=# %%)", source)
    cell = "# %%\n" + setup_cell() + "\n"
    found = [i for i, c in enumerate(cells) if c.startswith("# %%\n" + SETUP_FIRST_LINE)]
    if found:
        cells[found[0]] = cell
    else:  # right after the lesson's first cell (its title and objectives)
        first = next(i for i, c in enumerate(cells) if c.startswith("# %%"))
        cells.insert(first + 1, cell)
    return "".join(cells)


def generated() -> dict[Path, str]:
    """Every generated file and what it should hold now."""
    files = {README: with_readme_block(README.read_text(encoding="utf-8")), START_PAGE: start_page()}
    for x in lessons():
        files[x.source] = with_setup_cell(x.source.read_text(encoding="utf-8"))
    if SOLUTIONS_INDEX.parent.is_dir():  # a learner's copy of the course has no solutions/
        files[SOLUTIONS_INDEX] = solutions_index()
    return files


def stale() -> list[Path]:
    """The generated files whose contents differ from what the manifest makes (missing ones included)."""
    out = []
    for path, text in generated().items():
        try:
            same = path.read_text(encoding="utf-8") == text
        except OSError:
            same = False
        if not same:
            out.append(path)
    return out


def write_generated() -> list[Path]:
    """Rewrite the generated files that are out of date; return them."""
    changed = stale()
    texts = generated()
    for path in changed:
        path.write_text(texts[path], encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--check"]:
        out = stale()
        for path in out:
            print(f"{path.relative_to(REPO_ROOT)} is out of date: run `make sync`")
        return 1 if out else 0
    for path in write_generated():
        print(f"rewrote {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
