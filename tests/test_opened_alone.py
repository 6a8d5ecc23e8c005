"""A lesson opened alone runs: its setup cell fetches the course (tools/opened_alone.py) and every assert holds.

Offline, as close to Colab or a downloaded ``.ipynb`` as this machine allows: a fresh virtual environment that
has the locked packages but not the course (``import utils`` fails in it), the notebook copied alone into an
empty folder, and ``TORCH_COURSE_REPOSITORY`` pointed at a local clone of this repository's last commit. The
notebook is executed with nbclient, asserts only (its outputs are not compared). ``make test`` runs lessons 01, 04
and 08; ``make test-opened-alone`` all twelve. Not tested here: a real Colab (its network, its preinstalled
packages, its GPU) and the pip installs that a machine without the locked packages makes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from utils.paths import REPO_ROOT
from utils.syllabus import lessons

ALL = os.environ.get("TORCH_COURSE_OPENED_ALONE") == "all"
CHOSEN = [x for x in lessons() if ALL or x.number in (1, 4, 8)]

RUN = """
import sys, nbformat, nbclient
nb = nbformat.read(sys.argv[1], as_version=4)
nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": sys.argv[2]}}).execute()
setup = next(c for c in nb.cells if c.cell_type == "code")
print("".join(o.get("text", "") for o in setup.outputs))
"""


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    if not (REPO_ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout of the course: nothing to clone")
    dest = tmp_path_factory.mktemp("repository") / "torch-course"
    subprocess.run(["git", "clone", "--quiet", "--depth", "1", f"file://{REPO_ROOT}", str(dest)], check=True)
    return dest


def _bare_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("TORCH_COURSE_")}


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A venv without the course: the locked packages are visible (a .pth file), the editable course is not."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "locked_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = subprocess.run(
        [python, "-c", "import torch, nbclient; import utils.syllabus"], capture_output=True, cwd=venv, env=_bare_env()
    )
    assert b"No module named 'utils'" in probe.stderr, probe.stderr.decode()
    return python


@pytest.mark.parametrize("lesson", CHOSEN, ids=lambda x: x.ipynb[:2])
def test_a_lesson_opened_alone_fetches_the_course_and_runs(lesson, clone, bare_python, tmp_path):
    alone = tmp_path / "Downloads"
    alone.mkdir()
    notebook = alone / lesson.ipynb
    shutil.copy(REPO_ROOT / "notebooks" / lesson.ipynb, notebook)
    env = _bare_env() | {"TORCH_COURSE_REPOSITORY": f"file://{clone}", "MPLBACKEND": "Agg", "TQDM_DISABLE": "1"}
    done = subprocess.run(
        [bare_python, "-c", RUN, str(notebook), str(alone)], cwd=alone, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    said = done.stdout
    assert f"Fetching the course from file://{clone} into {alone / 'torch-course'}" in said, said
    assert "data files checked, every package already in place" in said, said
    assert (alone / "torch-course" / "course.toml").is_file()


def test_colab_links_appear_only_when_the_course_names_a_github_repository(monkeypatch):
    import dataclasses

    import tools.site as site
    import tools.syllabus as syllabus

    real = syllabus.course()
    assert "colab" not in syllabus.readme_block().lower() or real.repository
    for repository, shown in [("", False), ("https://github.com/example/torch-course", True)]:
        monkeypatch.setattr(syllabus, "course", lambda r=repository: dataclasses.replace(real, repository=r))
        first = syllabus.lessons()[0]
        url = f"https://colab.research.google.com/github/example/torch-course/blob/main/notebooks/{first.ipynb}"
        assert (url in syllabus.readme_block()) == shown
        assert (url in syllabus.start_page()) == shown
        assert (syllabus.colab_url(first) == url) == shown
        assert f'COURSE = os.environ.get("TORCH_COURSE_REPOSITORY", "{repository}")' in syllabus.setup_cell()
    assert site.colab_url is syllabus.colab_url  # the lesson pages use the same link
