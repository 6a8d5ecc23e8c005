"""``make lab``: JupyterLab as a learner meets it, on ``notebooks/`` and opened on its start page.

The file browser lists the start page and the lessons' ``.ipynb``. Their jupytext sources in ``notebooks/src/``
are hidden from it but stay paired: JupyterLab is given the settings of ``jupytext.toml`` (which it cannot find
itself, as that file lies above the folder it serves), so saving a notebook also rewrites its ``.py``. The
course's JupyterLab defaults (:data:`LAB_DEFAULTS`) go into the venv's ``overrides.json``; a learner's own
settings still win.

The start page, ``notebooks/00_start_here.md``, is made from the README's syllabus table, so the two cannot
drift (``tests/test_start_page.py`` checks it; ``make execute`` rewrites it with the README's run times).

Command line::

    python -m tools.lab [JUPYTER OPTION ...]   # make lab; options go to JupyterLab (--port=8899, --no-browser)
    python -m tools.lab --folder DIR ...       # the same on a copy of notebooks/ (tests/browser)
    python -m tools.lab --write-start-page     # rewrite notebooks/00_start_here.md from README.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import warnings
from pathlib import Path

from jupytext.config import parse_jupytext_configuration_file

from utils.paths import NOTEBOOKS_DIR, REPO_ROOT

README = REPO_ROOT / "README.md"
START_PAGE = NOTEBOOKS_DIR / "00_start_here.md"
JUPYTEXT_CONFIG = REPO_ROOT / "jupytext.toml"

HIDDEN = ["src", "__pycache__", "*.pyc", "*.pyo", ".DS_Store", "*~"]
"""Names the file browser does not list: the notebooks' sources, then jupyter_server's defaults."""

LAB_DEFAULTS = {
    # no "official Jupyter news?" prompt on the first start and no update check, so nothing is fetched
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
    # the start page opens rendered, with working links, rather than as Markdown source
    "@jupyterlab/docmanager-extension:plugin": {"defaultViewers": {"markdown": "Markdown Preview"}},
}
"""JupyterLab settings of the course, written to the venv's ``share/jupyter/lab/settings/overrides.json``."""

SYLLABUS_ROW = re.compile(
    r"^\| (?P<number>\d\d) \| \[(?P<title>[^]]+)\]\(notebooks/(?P<file>\d\d_\w+\.ipynb)\) \| (?P<teaches>[^|]+) "
    r"\| (?P<study>\d+ min) \| (?P<run>\d+ s)[¹²³⁴]? \|",
    re.M,
)
"""A lesson's row in the README's syllabus table (its footnote marks belong to the README)."""


def lab_settings_path() -> Path:
    return Path(sys.prefix, "share", "jupyter", "lab", "settings", "overrides.json")


def write_lab_settings() -> None:
    """Write :data:`LAB_DEFAULTS` into this environment's ``overrides.json`` (when they are not there yet)."""
    path, text = lab_settings_path(), json.dumps(LAB_DEFAULTS, indent=2) + "\n"
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def lab_options(folder: Path = NOTEBOOKS_DIR) -> list[str]:
    """JupyterLab's command-line options for the course, serving ``folder``."""
    jupytext = parse_jupytext_configuration_file(str(JUPYTEXT_CONFIG))
    return [
        f"--ServerApp.root_dir={folder}",
        f"--LabApp.default_url=/lab/tree/{START_PAGE.name}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        *(f"--ContentsManager.{name}={value}" for name, value in jupytext.items()),
        *(f"--ContentsManager.hide_globs={name}" for name in HIDDEN),
        *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
    ]


def syllabus(readme: str) -> list[dict[str, str]]:
    """The lessons of the README's syllabus table, in order: number, title, file, teaches, study, run.
    The start page and the website's landing page (tools/site.py) are both made from it."""
    rows = [m.groupdict() for m in SYLLABUS_ROW.finditer(readme)]
    if not rows:
        raise ValueError("README.md: no syllabus row like '| 01 | [title](notebooks/01_x.ipynb) | ... | N min | N s |'")
    return rows


def syllabus_table(rows: list[dict[str, str]]) -> str:
    """The lessons as a Markdown table whose links are the notebooks' file names (relative to ``notebooks/``, and
    to the website's pages, which mkdocs-jupyter names after them)."""
    return "\n".join(
        [
            "| # | lesson | what it teaches | study time | run time |",
            "|---|---|---|---|---|",
            *(
                f"| {r['number']} | [{r['title']}]({r['file']}) | {r['teaches'].strip()} | {r['study']} | {r['run']} |"
                for r in rows
            ),
        ]
    )


def start_page(readme: str) -> str:
    """The start page's Markdown, made from the syllabus table of ``readme``."""
    rows = syllabus(readme)
    return f"""# Start here

{len(rows)} lessons, in order: each builds on the ones before it. Open one, read it from the top and run each
cell with Shift+Enter (or Run ▸ Run All Cells). Its first cell says what you will learn and what you should
know; its last section holds exercises that check your answers and give a hint when they are wrong.

{syllabus_table(rows)}

The study time is the time to read, run and think through a lesson once and do its exercises; the run time is
how long all its cells take on a 2-core CPU.

<!-- Made by `python -m tools.lab --write-start-page` from the syllabus in README.md: edit that, not this. -->
"""


def write_start_page() -> None:
    START_PAGE.write_text(start_page(README.read_text(encoding="utf-8")), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.lab", description=__doc__.split("\n")[0])
    parser.add_argument("--write-start-page", action="store_true", help=f"rewrite {START_PAGE.name} and exit")
    parser.add_argument("--folder", type=Path, default=NOTEBOOKS_DIR, help="the folder to serve (default: notebooks/)")
    args, jupyter_options = parser.parse_known_args(argv)
    if args.write_start_page:
        write_start_page()
        return 0
    write_lab_settings()
    # jupyter_core warns that its folders will move unless JUPYTER_PLATFORM_DIRS=1, but setting that variable
    # here would stop JupyterLab from reading a learner's own settings in ~/.jupyter: the warning is hidden instead.
    warnings.filterwarnings("ignore", message="Jupyter is migrating its paths", category=DeprecationWarning)
    # imported here: only starting JupyterLab needs it (tools.notebooks imports this module)
    from jupyterlab.labapp import LabApp

    LabApp.launch_instance(argv=[*lab_options(args.folder.resolve()), *jupyter_options])
    return 0


if __name__ == "__main__":
    sys.exit(main())
