"""The start page JupyterLab opens on (``notebooks/00_start_here.md``) and the notebooks' jupytext pairing."""

import re

import jupytext.config
import jupytext.paired_paths

from tools.lab import JUPYTEXT_CONFIG, README, START_PAGE, start_page
from tools.notebooks import source_path
from utils.paths import NOTEBOOKS_DIR, REPO_ROOT

LESSONS = sorted(p.name for p in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))


def test_the_start_page_is_the_readme_syllabus():
    assert START_PAGE.read_text(encoding="utf-8") == start_page(README.read_text(encoding="utf-8")), (
        f"{START_PAGE.name} is not made from README.md's syllabus: "
        "run `.venv/bin/python -m tools.lab --write-start-page`"
    )


def test_the_start_page_links_every_lesson_once_in_order():
    page = start_page(README.read_text(encoding="utf-8"))
    assert re.findall(r"^\| \d\d \| \[[^]]+\]\(([^)]+)\)", page, re.M) == LESSONS


def test_jupytext_pairs_each_notebook_with_the_source_the_tools_read():
    """What jupytext (and so JupyterLab, given the same settings by tools.lab) pairs: notebooks/src/NN_topic.py."""
    config = jupytext.config.load_jupytext_configuration_file(str(JUPYTEXT_CONFIG))
    formats = jupytext.config.normalize_formats(config.formats)[0]
    for name in LESSONS:
        paired = dict(
            (fmt["extension"], path)
            for path, fmt in jupytext.paired_paths.paired_paths(f"notebooks/{name}", "ipynb", formats)
        )
        assert REPO_ROOT / paired[".py"] == source_path(NOTEBOOKS_DIR / name)
