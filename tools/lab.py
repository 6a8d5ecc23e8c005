"""``make lab``: JupyterLab as a learner meets it, on ``notebooks/`` and opened on its start page.

The file browser lists the start page and the lessons' ``.ipynb``. Their jupytext sources in ``notebooks/src/``
are hidden from it but stay paired: JupyterLab is given the settings of ``jupytext.toml`` (which it cannot find
itself, as that file lies above the folder it serves), so saving a notebook also rewrites its ``.py``. The
course's JupyterLab defaults (:data:`LAB_DEFAULTS`) go into the venv's ``overrides.json``; a learner's own
settings still win.

The start page, ``notebooks/00_start_here.md``, is made from ``course.toml`` by :mod:`tools.syllabus`.

Command line::

    python -m tools.lab [JUPYTER OPTION ...]   # make lab; options go to JupyterLab (--port=8899, --no-browser)
    python -m tools.lab --folder DIR ...       # the same on a copy of notebooks/ (tests/browser)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

from jupytext.config import parse_jupytext_configuration_file

from tools.syllabus import START_PAGE
from utils.paths import NOTEBOOKS_DIR, REPO_ROOT

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.lab", description=__doc__.split("\n")[0])
    parser.add_argument("--folder", type=Path, default=NOTEBOOKS_DIR, help="the folder to serve (default: notebooks/)")
    args, jupyter_options = parser.parse_known_args(argv)
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
