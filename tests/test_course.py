"""tools/course.py: the venv holds exactly the lock, and the course's own packages are the ones imported."""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.course import (
    ROOT,
    compare,
    drift_message,
    installed_versions,
    lock_digest,
    locked_versions,
    pip_indexes,
    venv_lock,
)

WHERE_FROM = """
import importlib.metadata, importlib.util, json
provided = importlib.metadata.packages_distributions()
where = {name: [importlib.util.find_spec(name).origin, provided.get(name, [])] for name in ("utils", "tools")}
print(json.dumps(where))
"""
"""Where `import utils` and `import tools` would load from (found, not run: utils imports torch), and which
installed distributions say they provide them."""


def test_utils_and_tools_are_the_course_s_from_any_working_directory(tmp_path):
    """A notebook's kernel starts in notebooks/, a torchrun script anywhere: `import utils` must find the
    course's, never a same-named package some distribution installed into the venv."""
    found = json.loads(
        subprocess.run(
            [sys.executable, "-c", WHERE_FROM], cwd=tmp_path, check=True, capture_output=True, text=True
        ).stdout
    )
    for name, (file, distributions) in found.items():
        others = sorted(set(distributions) - {"torch-course", "torch_course"})
        assert not others and Path(file).is_relative_to(ROOT), (
            f"`import {name}` gives {file}, provided by {others or 'no known distribution'}, not the course's "
            f"{ROOT / name}: uninstall it (`{sys.executable} -m pip uninstall {' '.join(others) or name}`), "
            "then `make venv`"
        )


def test_the_lock_s_markers_pick_this_python_s_version():
    lock = (
        "numpy==2.4.6 ; python_full_version >= '3.11'\n"
        "    # via torch-course\n"
        "numpy==2.2.6 ; python_full_version < '3.11'\n"
    )
    assert locked_versions(lock) == {"numpy": "2.4.6" if sys.version_info >= (3, 11) else "2.2.6"}


def test_drift_names_each_difference_and_the_fix():
    locked = {"numpy": "2.4.6", "tqdm": "4.70.1", "einops": "0.8.2"}
    installed = {"numpy": "2.3.0", "einops": "0.8.2", "pandas": "3.0.0", "torch-course": "1.0", "pip": "25.0"}
    wrong, extra = compare(locked, installed)
    assert (wrong, extra) == (["numpy: 2.3.0, locked 2.4.6", "tqdm: not installed, locked 4.70.1"], ["pandas"])
    message = drift_message(Path(".venv"), wrong, extra, ROOT / "requirements.txt")
    assert "pandas: installed, not in requirements.txt" in message and "venv` reinstalls exactly" in message


def test_this_venv_holds_exactly_its_lock():
    venv = Path(sys.prefix)
    wrong, extra = compare(locked_versions(venv_lock(venv).read_text()), installed_versions())
    assert not wrong and not extra, drift_message(venv, wrong, extra, venv_lock(venv))


def test_pip_s_indexes_reach_uv_one_url_per_option(tmp_path, monkeypatch):
    """pip.conf's usual multi-line extra-index-url, and a Windows path, as pip prints them (repr) and uv needs them."""
    config = tmp_path / "pip.conf"
    config.write_text(
        "[global]\nextra-index-url =\n    https://a.example/simple\n    https://b.example/simple\n"
        "index-url = C:\\mirror\\simple\n"
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    options = pip_indexes(Path(sys.executable))
    assert "--extra-index-url=https://a.example/simple" in options
    assert "--extra-index-url=https://b.example/simple" in options
    assert "--index-url=C:\\mirror\\simple" in options, options
    assert "--index-strategy=unsafe-best-match" in options


def test_a_tool_setting_does_not_reinstall_the_venv(tmp_path, monkeypatch):
    """The stamp covers the lock and the project's metadata, not [tool.*] tables (ruff, pytest)."""
    import tools.course as course

    (tmp_path / "requirements.txt").write_text("six==1.17.0\n")
    pyproject = tmp_path / "pyproject.toml"
    monkeypatch.setattr(course, "ROOT", tmp_path)
    pyproject.write_text('[project]\nname = "x"\n\n[tool.ruff]\nline-length = 120\n')
    before = lock_digest(tmp_path / "requirements.txt")
    pyproject.write_text('[project]\nname = "x"\n\n[tool.ruff]\nline-length = 100\n')
    assert lock_digest(tmp_path / "requirements.txt") == before
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["six"]\n\n[tool.ruff]\nline-length = 100\n')
    assert lock_digest(tmp_path / "requirements.txt") != before


def test_every_learner_command_of_make_runs_without_make_too():
    """Windows without make: python tools/course.py offers what make offers a learner and an author."""
    from tools.course import COMMANDS

    assert {"progress", "execute", "sync", "check", "site"} <= set(COMMANDS)
    done = subprocess.run(
        [sys.executable, "tools/course.py", "--venv", sys.prefix, "check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "all notebooks are in sync" in done.stdout, done.stdout + done.stderr


# --- the install tool on damage (probes I1b, I2, I4 of issue 31) ---------------------------------------------------

FAKE_PIP = """#!/bin/sh
# stands in for `python -m pip install -q --target DIR uv==...`: installs a uv that runs
mkdir -p "$6/bin"
printf '#!/bin/sh\\necho uv 0.13.9\\n' > "$6/bin/uv"
chmod +x "$6/bin/uv"
"""


@pytest.mark.skipif(os.name != "posix", reason="shell scripts stand in for python and uv")
def test_i1b_a_damaged_bootstrapped_uv_is_installed_again(tmp_path, monkeypatch, capsys):
    """Probe I1b: a truncated .venv/.uv/bin/uv (a full disk, an interrupted copy) and no uv on the PATH."""
    from tools import course

    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(FAKE_PIP)
    (venv / "bin" / "python").chmod(0o755)
    uv = venv / ".uv" / "bin" / "uv"
    uv.parent.mkdir(parents=True)
    uv.write_bytes(b"\x7fELF\x02\x01\x01" + b"\x00" * 40)  # the start of a binary, cut off
    uv.chmod(0o755)
    monkeypatch.setattr(course.shutil, "which", lambda name: None)
    command = course.uv_command(venv)
    assert command == [str(uv)] and subprocess.run([*command, "--version"]).returncode == 0
    assert "does not run (damaged): installing it again" in capsys.readouterr().out


def test_i2_a_read_only_folder_is_named_not_a_missing_venv_package(tmp_path, monkeypatch):
    """Probe I2: the course folder is read-only; the advice was to install python3.X-venv."""
    import tempfile

    from tools import course

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    monkeypatch.setattr(course.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, b"", b""))
    with pytest.raises(SystemExit) as info:
        course.ensure_venv(tmp_path / ".venv")
    message = str(info.value)
    assert f"Cannot write into {tmp_path} (Read-only file system), where the venv .venv is created" in message
    assert "apt install" not in message and "\n" not in message


@pytest.mark.parametrize(
    "text, says",
    [
        ("six\n", "line 1 is not a pin (name==version): 'six'"),
        ("", "pins no package (it is empty)"),
        ("six==1.1\nnumpy @@@\n", "line 2 is not a pin"),
    ],
)
def test_i4_a_damaged_lock_is_named_in_one_line_with_the_fix(tmp_path, text, says):
    """Probe I4: an unpinned line passed `venv` and broke `test` with a traceback; an empty lock got `make venv`."""
    from tools.course import check_lock

    lock = tmp_path / "requirements.txt"
    lock.write_text(text)
    with pytest.raises(SystemExit) as info:
        check_lock(lock)
    assert says in str(info.value) and "git checkout -- requirements.txt" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.skipif(os.name != "posix", reason="a symlink stands in for the venv's python")
def test_i4_the_lock_check_shows_the_child_s_error_in_one_line(tmp_path):
    """Probe I4: `make test`'s lock check died with a CalledProcessError traceback that hid the child's error."""
    from tools.course import differences

    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    lock = tmp_path / "requirements.txt"
    lock.write_text("six\n")
    with pytest.raises(SystemExit) as info:
        differences(venv, lock)
    message = str(info.value)
    assert message.startswith("could not compare .venv with requirements.txt: ValueError: 'six' is not a pin")
    assert "\n" not in message
