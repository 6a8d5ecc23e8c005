"""Where things live in the repository, independent of the current working directory."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT: Path = Path(__file__).resolve().parent.parent
"""The repository root (the folder holding ``utils/``, ``notebooks/`` and ``data/``)."""

DATA_DIR: Path = REPO_ROOT / "data"
"""Data sets shipped with the course; nothing is downloaded at run time."""

NOTEBOOKS_DIR: Path = REPO_ROOT / "notebooks"


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


def new_file_mode() -> int:
    """The permission bits ``open()`` gives a new file: ``0o666`` less the process's umask.

    ``tempfile.mkstemp`` always creates ``0o600`` files; a file written through one and renamed
    into place should get this mode instead, so that a shared checkout stays readable by the
    others exactly when the user's umask says so.
    """
    try:  # Linux >= 4.7 reports the umask without changing it
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # elsewhere: read it by setting it, and put it back at once
    os.umask(mask)
    return 0o666 & ~mask
