"""Where things live in the repository, independent of the current working directory.
Used by notebooks 03, 04, 05, 06 and 08, and by most modules of ``utils/``.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT: Path = Path(__file__).resolve().parent.parent
"""The repository root (the folder holding ``utils/``, ``notebooks/`` and ``data/``)."""

DATA_DIR: Path = REPO_ROOT / "data"
"""Data sets shipped with the course; nothing is downloaded at run time."""

NOTEBOOKS_DIR: Path = REPO_ROOT / "notebooks"

SOURCES_DIR: Path = NOTEBOOKS_DIR / "src"
"""The notebooks' jupytext sources, ``NN_topic.py`` for ``notebooks/NN_topic.ipynb`` (paired by ``jupytext.toml``)."""


def relpath(path: str | os.PathLike[str]) -> str:
    """Return ``path`` relative to the repository root, as a POSIX string.

    Notebooks print paths through this function so that stored outputs do not depend on
    where the repository was cloned. A path outside the repository is returned unchanged
    (absolute), so nothing is hidden.

    >>> relpath(REPO_ROOT / "data" / "mnist")
    'data/mnist'
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"relpath() expects a str or os.PathLike, got {type(path).__name__}")
    p = Path(path).resolve()
    try:
        return p.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return p.as_posix()
