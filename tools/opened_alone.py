"""A lesson opened alone (in Colab, or a ``.ipynb`` downloaded without its course) fetches the course and runs in it.

Every lesson's first code cell (the "setup cell", written by ``python -m tools.syllabus`` from
``course.toml``) tries ``import utils.syllabus``. Inside the course that works and the cell does nothing.
Opened alone it fails, and the cell runs this file (read from the course's folder next to the notebook if
there is one, else downloaded from the repository that ``course.toml`` names, or from the location in the
``TORCH_COURSE_REPOSITORY`` variable). This file, with the standard library only:

1. finds the course: the folder above the notebook when it is the course's ``notebooks/``, else a folder
   ``torch-course/`` next to the notebook, fetched once (a GitHub repository as its zip archive, any other
   location with ``git clone``);
2. checks every data file against ``data/SHA256SUMS``;
3. installs, with pip, the packages the lessons import whose version differs from the course's lock
   (``requirements.txt``): nothing on a machine that has them, PyTorch and a few others in Colab;
4. puts the course on ``sys.path`` (and ``PYTHONPATH``, for the processes lessons 08 and 09 start) and makes
   the course's ``notebooks/`` folder the working directory, as the lessons expect.

It says what it does and how long it took. ``tests/test_opened_alone.py`` runs lessons this way, offline, with a
local clone as the repository.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

ENV_VAR = "TORCH_COURSE_REPOSITORY"
FOLDER = "torch-course"
AUTHORING = {"jupyterlab", "ipykernel", "jupytext", "nbformat", "nbclient", "nbval", "pytest", "pytest-xdist", "ruff"}
"""Packages of the lock that writing and testing the course need, and a lesson does not."""


def is_course(folder: Path) -> bool:
    return (folder / "course.toml").is_file() and (folder / "utils" / "syllabus.py").is_file()


def find_or_fetch(location: str, here: Path) -> Path:
    """The course's folder: above ``here`` (a notebook in the course's ``notebooks/``), or ``here/torch-course``,
    fetched from ``location`` when it is not there yet."""
    if here.name == "notebooks" and is_course(here.parent):
        return here.parent
    dest = here / FOLDER
    if is_course(dest):
        print(f"The course is already in {dest}: using it.")
        return dest
    if dest.exists():
        raise RuntimeError(
            f"{dest} exists but is not the course (no course.toml and utils/ in it): move it away, or open "
            "the notebook from another folder, then run this cell again"
        )
    if not location:
        raise RuntimeError(
            "this notebook was opened without its course, and this copy of it names no repository to fetch the "
            "course from: get the whole course (its README says how) and open the notebook from its notebooks/ "
            f"folder, or set the environment variable {ENV_VAR} to the course's location"
        )
    print(f"Fetching the course from {location} into {dest} (about a minute, once) ...", flush=True)
    with tempfile.TemporaryDirectory(dir=here) as tmp:
        got = Path(tmp) / FOLDER
        if location.startswith("https://github.com/"):
            _unzip_github(location, got)
        else:
            subprocess.run(["git", "clone", "--quiet", "--depth", "1", location, str(got)], check=True)
        if not is_course(got):
            raise RuntimeError(f"{location} holds no course (no course.toml and utils/ at its top)")
        got.rename(dest)
    return dest


def _unzip_github(repository: str, dest: Path) -> None:
    url = repository.rstrip("/").removesuffix(".git") + "/archive/HEAD.zip"
    archive = dest.parent / "course.zip"
    with urllib.request.urlopen(url) as response, open(archive, "wb") as f:
        shutil.copyfileobj(response, f)
    with zipfile.ZipFile(archive) as z:
        z.extractall(dest.parent / "unzipped")
    (top,) = (dest.parent / "unzipped").iterdir()  # GitHub's archive holds one folder, REPO-BRANCH/
    top.rename(dest)


def check_data(course: Path) -> int:
    """Every file of ``data/SHA256SUMS`` present and intact; returns how many were checked."""
    sums = course / "data" / "SHA256SUMS"
    count = 0
    for line in sums.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        digest, name = line.split(maxsplit=1)
        path = course / "data" / name.strip()
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            raise RuntimeError(
                f"{path} is missing or damaged (data/SHA256SUMS says another SHA-256): delete {course} and run "
                "this cell again to fetch the course anew"
            )
        count += 1
    return count


def lesson_packages(course: Path) -> dict[str, str]:
    """{package: locked version} for what the lessons import: pyproject.toml's dependencies, less authoring."""
    text = (course / "pyproject.toml").read_text(encoding="utf-8")
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.M | re.S).group(1)
    names = [m.group(1).lower() for m in re.finditer(r'^\s*"([A-Za-z0-9_.-]+)', block, re.M)]
    locked = dict(
        (m.group(1).lower(), m.group(2))
        for m in re.finditer(r"^([A-Za-z0-9_.-]+)==([^\s;]+)", (course / "requirements.txt").read_text(), re.M)
    )
    return {n: locked[n] for n in names if n not in AUTHORING and n in locked}


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def install_packages(course: Path) -> list[str]:
    """pip-install the lesson packages whose installed version is not the locked one; returns what was installed."""
    wanted = lesson_packages(course)
    missing = [f"{n}=={v}" for n, v in wanted.items() if (_installed(n) or "").split("+")[0] != v]
    if not missing:
        return []
    print(f"Installing {', '.join(missing)} (a few minutes for PyTorch) ...", flush=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", *missing, "-c", str(course / "requirements.txt")],
        check=True,
    )
    if any(m.startswith("torch==") for m in missing) and "torch" in sys.modules:
        raise RuntimeError(
            "PyTorch was replaced while this kernel had the old one loaded: restart the kernel (in Colab: "
            "Runtime → Restart session), then run this cell again (it will find everything in place)"
        )
    return missing


def enter(course: Path) -> None:
    """Make the course importable here and in the processes the lessons start; work from its notebooks/."""
    root = str(course)
    if root not in sys.path:
        sys.path.insert(0, root)
    for name in [m for m in sys.modules if m == "utils" or m.startswith("utils.")]:
        del sys.modules[name]  # another package called utils, imported by the failed attempt
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    os.chdir(course / "notebooks")


def main(location: str = "") -> Path:
    start = time.monotonic()
    location = os.environ.get(ENV_VAR) or location
    course = find_or_fetch(location, Path.cwd())
    files = check_data(course)
    installed = install_packages(course)
    enter(course)
    print(
        f"Ready in {time.monotonic() - start:.0f} s: the course is in {course} ({files} data files checked"
        + (f", installed {len(installed)} packages" if installed else ", every package already in place")
        + "); this notebook now runs in its notebooks/ folder."
    )
    return course


if __name__ == "opened_alone":  # run by a lesson's setup cell
    main(COURSE)  # noqa: F821 - the setup cell passes COURSE in this file's namespace
