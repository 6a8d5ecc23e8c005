"""The course manifest (``course.toml``) and what is made from it: one list of lessons, nothing kept by hand twice."""

import re
import subprocess

import jupytext.config
import jupytext.paired_paths
import pytest

from tools import syllabus as generated
from tools.notebooks import dangling_references, read_source, section_numbers, source_path
from tools.syllabus import START_PAGE, start_page
from utils.paths import NOTEBOOKS_DIR, REPO_ROOT
from utils.syllabus import ManifestError, course, lessons, parse

JUPYTEXT_CONFIG = REPO_ROOT / "jupytext.toml"
GOOD = """
[course]
name = "demo"
pytorch = "9.99"

[[lessons]]
number = 1
slug = "tensors"
title = "Tensors"
title_zh = "张量"
short = "tensors"
study_minutes = 60
teaches = "x"
gpu = "y"
[[lessons.exercises]]
kind = "predict"
title = "Predict"
"""


def test_the_generated_pages_are_up_to_date():
    """The README's syllabus, the start page and the solutions index are what course.toml makes."""
    stale = [path.relative_to(REPO_ROOT).as_posix() for path in generated.stale()]
    assert stale == [], f"{stale} differ from what course.toml makes: run `make sync`"


def test_the_start_page_links_every_lesson_once_in_order_with_its_measured_run_time():
    page = start_page()
    assert re.findall(r"^\| \d\d \| \[[^]]+\]\(([^)]+)\)", page, re.M) == [x.ipynb for x in lessons()]
    for x in lessons():
        row = next(line for line in page.splitlines() if f"]({x.ipynb})" in line)
        assert re.search(rf"\| {x.study_minutes} min \| \d+ s[¹²³]? \|$", row), row
    assert START_PAGE.read_text(encoding="utf-8") == page


def test_the_solutions_index_has_a_column_per_exercise_of_the_longest_lesson(monkeypatch):
    manifest = parse(
        GOOD
        + GOOD.split("\n[course]")[0]
        + GOOD[GOOD.index("[[lessons]]") :].replace("number = 1", "number = 2")
        + '[[lessons.exercises]]\nkind = "write"\ntitle = "Second"\n'
    )
    monkeypatch.setattr(generated, "lessons", lambda: manifest.lessons)
    index = generated.solutions_index()
    assert "| notebook | 1 | 2 |" in index
    assert "| [01 tensors](01_tensors.md) | Predict (predict) |  |" in index
    assert "| [02 tensors](02_tensors.md) | Predict (predict) | Second (write) |" in index


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.replace('pytorch = "9.99"', 'pytorch = "9.99.1"'), "should be a minor version"),
        (lambda t: t.replace("number = 1", "number = 3"), "lessons are numbered 1, 2, ... in order"),
        (lambda t: t.replace('slug = "tensors"', 'slug = "Tensors!"'), "slug = 'Tensors!' should be lower-case"),
        (lambda t: t.replace("study_minutes = 60\n", ""), "lesson 1: no 'study_minutes'; add `study_minutes = ...`"),
        (lambda t: t.replace("study_minutes = 60", 'study_minutes = "60"'), "study_minutes = '60' should be a int"),
        (lambda t: t.replace('kind = "predict"', 'kind = "quiz"'), "kind = 'quiz' is not one of predict, write"),
        (lambda t: t.replace('title = "Tensors"', "title = Tensors"), "course.toml is not valid TOML"),
        (lambda t: t.split("[[lessons]]")[0], "no [[lessons]]"),
    ],
)
def test_a_broken_manifest_is_refused_with_the_field_and_the_fix(change, message):
    assert parse(GOOD).lessons[0].stem == "01_tensors"
    with pytest.raises(ManifestError, match=re.escape(message)):
        parse(change(GOOD))


def test_the_pytorch_version_taught_is_the_one_pinned():
    pinned = re.search(r'"torch==(\d+\.\d+)\.\d+"', (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pinned and pinned[1] == course().pytorch, "pyproject.toml pins another PyTorch than course.toml teaches"
    locked = re.search(r"^torch==(\d+\.\d+)\.", (REPO_ROOT / "requirements.txt").read_text(encoding="utf-8"), re.M)
    assert locked and locked[1] == course().pytorch, "requirements.txt: run `make lock`"


def test_the_version_taught_is_written_only_where_it_is_a_fact_of_a_lesson_or_a_measurement():
    """A PyTorch bump edits course.toml and pyproject.toml; the rest reads the version from course.toml. Lessons
    (which state what this release does, and are re-run on a bump), lock files and dated measurements may name it."""
    allowed = ("notebooks/", "requirements", "course.toml", "pyproject.toml", "benchmarks/README.md")
    files = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True).stdout.split()
    found = []
    for name in files:
        path = REPO_ROOT / name
        if name.startswith(allowed) or not path.is_file() or path.suffix not in (".py", ".md", ".yml", ".toml", ""):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if name == "README.md":  # its syllabus block is made from course.toml
            text = text[: text.find(generated.BEGIN)] + text[text.find(generated.END) :]
        found += [f"{name}: {m[0]!r}" for m in re.finditer(rf"\b{re.escape(course().pytorch)}(?:\.\d+)?\b", text)]
    assert found == [], "name the version through course.toml (utils.syllabus.course().pytorch): " + "; ".join(found)


def test_jupytext_pairs_each_notebook_with_the_source_the_tools_read():
    """What jupytext (and so JupyterLab, given the same settings by tools.lab) pairs: notebooks/src/NN_topic.py."""
    config = jupytext.config.load_jupytext_configuration_file(str(JUPYTEXT_CONFIG))
    formats = jupytext.config.normalize_formats(config.formats)[0]
    for x in lessons():
        paired = dict(
            (fmt["extension"], path)
            for path, fmt in jupytext.paired_paths.paired_paths(f"notebooks/{x.ipynb}", "ipynb", formats)
        )
        assert REPO_ROOT / paired[".py"] == source_path(NOTEBOOKS_DIR / x.ipynb) == x.source


def test_the_section_references_of_solutions_and_hints_name_real_headings():
    """The lessons' own references are checked by `make check`; the teachers' solutions and the exercises' hints
    refer to their lesson's sections too."""
    sections = {x.nn: section_numbers(read_source(x.source)) for x in lessons()}
    dangling = []
    for x in lessons():
        for path in (REPO_ROOT / "solutions" / f"{x.stem}.md", REPO_ROOT / "utils" / "exercises" / f"nb{x.nn}.py"):
            if path.is_file():
                text = path.read_text(encoding="utf-8")
                dangling += [
                    f"{path.relative_to(REPO_ROOT)}: {ref}" for ref in dangling_references(text, x.nn, sections)
                ]
    assert dangling == []
