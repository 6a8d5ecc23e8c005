"""Install and run the course with Python alone: what ``make venv``, ``make lab`` and ``make test`` do.

The Makefile calls this script, and without ``make`` (Windows) it is called directly::

    python tools/course.py venv    # create .venv, or bring it back to the lock (requirements.txt)
    python tools/course.py lab     # the venv, then JupyterLab on notebooks/
    python tools/course.py test    # the venv, the lock check, then the unit tests and every notebook
    python tools/course.py lock    # regenerate requirements.txt and requirements-browser.txt (uv)
    python tools/course.py progress [NN ...]   # and execute, sync, check, site: what make NAME does

It needs only the standard library, as it runs before the venv exists. Packages are installed with uv
when it can be had (on the PATH, or bootstrapped with pip into ``.venv/.uv``), else with pip; uv is
given pip's configured indexes, as uv does not read pip's configuration.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.txt"
BROWSER_LOCK = ROOT / "requirements-browser.txt"
"""The lock with the ``browser`` (Playwright) and ``site`` (MkDocs) extras added: the same pins plus theirs."""
UV = "uv==0.13.9"
"""The installer bootstrapped when uv is not on the PATH, pinned: the options used here are uv 0.13's."""
SUPPORTED_PYTHONS = ((3, 10), (3, 14))
"""The oldest and newest Python the course runs on (pyproject.toml's requires-python; `make test-pythons`)."""
JOBS = 2
"""Notebooks run side by side by ``make test`` and ``make execute``: one per core of the 2-core course machine."""
COMMANDS: dict[str, tuple[list[str], str]] = {
    "progress": (["utils.exercises"], "which exercises pass, per notebook (make progress)"),
    "execute": (["tools.notebooks", "execute"], "re-run notebooks and store fresh outputs (make execute)"),
    "sync": (["tools.notebooks", "sync"], "copy prose edits of the sources into the notebooks (make sync)"),
    "check": (["tools.notebooks", "check"], "list stale or broken notebooks (make check)"),
    "site": (["tools.site"], "build the course's website into build/site/ (make site)"),
}
"""The make targets that run one module of the course in the venv: ``python tools/course.py NAME [NN ...]``."""
OWN_PACKAGES = {"torch-course", "pip", "setuptools"}
"""Installed in the venv but not locked: the course itself and the installers ``python -m venv`` seeds."""


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def run(*cmd: object, **kwargs) -> None:
    """Run a command; on failure, exit with its status (its own output says why)."""
    code = subprocess.run([str(c) for c in cmd], **kwargs).returncode
    if code:
        sys.exit(code)


def lock_digest(lock: Path) -> str:
    """What the stamp records: the lock installed and the project metadata installed with it (pyproject.toml up
    to its first ``[tool.`` table, so that a ruff or pytest setting does not reinstall the venv)."""
    project = (ROOT / "pyproject.toml").read_bytes().split(b"\n[tool.")[0]
    return f"{lock.name} " + hashlib.sha256(lock.read_bytes() + project).hexdigest()


def uv_command(venv: Path) -> list[str] | None:
    """uv from the PATH, or bootstrapped into ``venv/.uv`` by pip (outside site-packages); None if neither."""
    if found := shutil.which("uv"):
        return [found]
    tool_dir = venv / ".uv"

    def bootstrapped() -> Path | None:  # pip --target puts scripts in bin/, on Windows too (its posix_home scheme)
        names = ("bin/uv.exe", "Scripts/uv.exe") if os.name == "nt" else ("bin/uv",)
        return next((tool_dir / name for name in names if (tool_dir / name).is_file()), None)

    if (uv := bootstrapped()) and not runs(uv):  # half a file: a full disk, an interrupted copy (probe I1b)
        print(f"the uv in {tool_dir} does not run (damaged): installing it again", flush=True)
        shutil.rmtree(tool_dir, ignore_errors=True)
    if not bootstrapped():
        print("installing uv (a fast installer) into", tool_dir, flush=True)
        pip = [venv_python(venv), "-m", "pip", "install", "-q", "--target", tool_dir, UV]
        subprocess.run([str(c) for c in pip])
    if (uv := bootstrapped()) and runs(uv):
        return [str(uv)]
    print("uv could not be installed: installing with pip instead (slower)", flush=True)
    return None


def runs(program: Path) -> bool:
    """Whether ``program --version`` starts and succeeds (a truncated binary segfaults or is no executable)."""
    try:
        return subprocess.run([str(program), "--version"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def pip_indexes(py: Path) -> list[str]:
    """pip's configured indexes (pip.conf, PIP_* variables) as uv options: pip treats all indexes alike."""
    listing = subprocess.run([str(py), "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    scope_rank = {"global": 0, "user": 1, "site": 2, ":env:": 3}  # pip's precedence, lowest first
    settings: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        scope, _, name = key.rpartition(".")
        rank = scope_rank.get(scope, 0)
        if name in ("index-url", "extra-index-url", "find-links") and rank >= settings.get(name, (-1, ""))[0]:
            settings[name] = (rank, ast.literal_eval(value))  # pip prints repr(): newlines, escaped backslashes
    options = [f"--{name}={url}" for name, (_, urls) in settings.items() for url in urls.split()]
    if "extra-index-url" in settings:
        options.append("--index-strategy=unsafe-best-match")
    return options


def install(venv: Path, lock: Path) -> None:
    """Make the venv hold exactly the lock's packages plus the course (editable), with uv or else pip."""
    py = venv_python(venv)
    print(f"installing {lock.name} into {venv.name} (a few minutes the first time)", flush=True)
    if uv := uv_command(venv):
        # --compile-bytecode as pip does, so that no import compiles torch (or fails to store it)
        options = ["--python", py, "--compile-bytecode", *pip_indexes(py)]
        run(*uv, "pip", "sync", "-q", *options, lock)
        run(*uv, "pip", "install", "-q", *options, "--no-deps", "-e", ROOT)
    else:
        pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        run(*pip, "-r", lock)
        run(*pip, "--no-deps", "-e", ROOT)
        if extra := differences(venv, lock)[1]:
            run(py, "-m", "pip", "uninstall", "-y", "-q", *extra)
    # before the editable install, the Makefile put the repository on sys.path with this file (after site-packages)
    for old_pth in venv.glob("lib/python3*/site-packages/torch_course.pth"):
        old_pth.unlink()


def venv_is_usable(py: Path) -> bool:
    """The venv's Python starts, is this script's version (``make PYTHON=...`` may have changed it) and has pip."""
    check = f"import sys, pip; sys.exit(sys.version_info[:2] != {tuple(sys.version_info[:2])})"
    return py.exists() and subprocess.run([str(py), "-c", check], capture_output=True).returncode == 0


def check_writable(folder: Path, what: str) -> None:
    """Exit with one line naming ``folder`` and the fix when a file cannot be created in it (probe I2)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        sys.exit(
            f"Cannot write into {folder} ({err.strerror}), where {what}. Make it writable, or clone the course "
            "into a folder of yours (or give another venv: make VENV=path, python tools/course.py --venv path), "
            "then run this again."
        )


def check_lock(lock: Path) -> None:
    """Exit with one line naming the file and the fix when the lock is not a list of pins (probe I4).

    Each line that is not a comment (``#``, indented ``# via``) must pin one package (``name==version``, with an
    optional ``; marker``), as ``make lock`` writes them; uv would accept an unpinned name, which the lock check
    of ``make test`` then cannot compare.
    """
    fix = f"restore it with `git checkout -- {lock.name}`"
    try:
        text = lock.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        sys.exit(f"{lock} cannot be read ({err}): {fix}.")
    pins = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith(("#", "-")):  # comments, options (--index-url ...)
            continue
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]*\])?==[A-Za-z0-9.+!_-]+( ; .+)?", line):
            sys.exit(f"{lock} line {number} is not a pin (name==version): {line[:80]!r}; the lock is damaged: {fix}.")
        pins += 1
    if not pins:
        sys.exit(f"{lock} pins no package (it is empty); the lock is damaged: {fix}.")


def ensure_venv(venv: Path, browser: bool = False, exact: bool = False) -> Path:
    """Create the venv if it is missing or broken; install the lock when it changed (or, with ``exact``,
    when the venv drifted from it). The browser lock satisfies the plain one: it adds packages only."""
    py = venv_python(venv)
    lock = BROWSER_LOCK if browser else LOCK
    check_lock(lock)
    if not venv_is_usable(py):
        check_writable(venv.parent, f"the venv {venv.name} is created")
        shutil.rmtree(venv, ignore_errors=True)
        print(f"creating {venv.name} with Python {sys.version.split()[0]}", flush=True)
        if subprocess.run([sys.executable, "-m", "venv", str(venv)]).returncode or not venv_is_usable(py):
            shutil.rmtree(venv, ignore_errors=True)
            v = "{}.{}".format(*sys.version_info[:2])
            sys.exit(
                f"{sys.executable} could not create a venv with pip in {venv}. On Debian or Ubuntu install "
                f"the package python{v}-venv (sudo apt install python{v}-venv), then run this again."
            )
    stamp = venv / ".installed"
    accepted = {lock_digest(lock)} if browser else {lock_digest(LOCK), lock_digest(BROWSER_LOCK)}
    if not stamp.exists() or stamp.read_text() not in accepted or (exact and any(differences(venv, venv_lock(venv)))):
        check_writable(venv, "the packages are installed")
        install(venv, lock)
        stamp.write_text(lock_digest(lock))
    return py


def differences(venv: Path, lock: Path) -> tuple[list[str], list[str]]:
    """(locked packages missing or at another version, installed packages the lock does not name),
    computed by the venv's own Python (lock markers need its ``packaging``)."""
    done = subprocess.run(
        [str(venv_python(venv)), __file__, "--venv", venv, "_differences", lock], capture_output=True, text=True
    )
    if done.returncode:  # its error in one line, not a CalledProcessError traceback that hides it (probe I4)
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        fix = "make venv" if shutil.which("make") and os.name != "nt" else "python tools/course.py venv"
        sys.exit(f"could not compare {venv.name} with {lock.name}: {last}. Check {lock.name}, then `{fix}`.")
    return tuple(json.loads(done.stdout))


def locked_versions(lock_text: str) -> dict[str, str]:
    """{normalized name: version} of a lock's lines whose environment markers hold for this Python."""
    from packaging.requirements import Requirement  # in the venv only, where this runs

    pins = {}
    for line in lock_text.splitlines():
        if line and not line.startswith((" ", "#", "-")):
            req = Requirement(line)
            spec = list(req.specifier)
            if len(spec) != 1 or spec[0].operator != "==":
                raise ValueError(f"{line!r} is not a pin (name==version)")
            if req.marker is None or req.marker.evaluate():
                pins[canonical(req.name)] = spec[0].version
    return pins


def canonical(name: str) -> str:
    """A distribution name as PEP 503 normalises it: runs of -, _ and . become one -, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_versions() -> dict[str, str]:
    from importlib.metadata import distributions

    return {canonical(d.metadata["Name"]): d.version for d in distributions()}


def compare(locked: dict[str, str], installed: dict[str, str]) -> tuple[list[str], list[str]]:
    """(how each locked package differs, installed packages not locked), the course's own excepted."""
    wrong = [
        f"{name}: {installed.get(name, 'not installed')}, locked {version}"
        for name, version in sorted(locked.items())
        if installed.get(name) != version
    ]
    extra = sorted(set(installed) - set(locked) - OWN_PACKAGES)
    return wrong, extra


def drift_message(venv: Path, wrong: list[str], extra: list[str], lock: Path) -> str:
    lines = [
        f"{venv.name} differs from {lock.name}:",
        *("  " + w for w in wrong),
        *(f"  {name}: installed, not in {lock.name}" for name in extra),
    ]
    fix = "make venv" if shutil.which("make") and os.name != "nt" else "python tools/course.py venv"
    return "\n".join([*lines, f"Fix: `{fix}` reinstalls exactly the locked versions."])


def venv_lock(venv: Path) -> Path:
    """The lock the venv was installed from (its stamp says which), requirements.txt by default."""
    stamp = venv / ".installed"  # an empty one was written by an older Makefile
    return ROOT / ((stamp.read_text().split() if stamp.exists() else []) or [LOCK.name])[0]


def lock_drift(venv: Path) -> int:
    """1, with what differs and how to fix it, when the venv is not exactly its lock; else 0."""
    lock = venv_lock(venv)
    wrong, extra = differences(venv, lock)
    if wrong or extra:
        print(drift_message(venv, wrong, extra, lock), file=sys.stderr)
        return 1
    return 0


def lint(py: Path) -> int:
    """1, with ruff's findings, when the code breaks the lint rules or is not formatted ([tool.ruff] in
    pyproject.toml); else 0. It runs before the tests because it takes a second and the tests minutes."""
    checks = [["check", "--quiet"], ["format", "--check", "--quiet"]]
    if failed := [c[0] for c in checks if subprocess.run([str(py), "-m", "ruff", *c], cwd=ROOT).returncode]:
        fix = f"`{py} -m ruff format` reformats; `{py} -m ruff check --fix` fixes what it can"
        print(f"ruff {' and '.join(failed)} found the problems above. {fix}.", file=sys.stderr)
        return 1
    return 0


def lock(venv: Path) -> int:
    """Regenerate both locks from pyproject.toml, for every platform and Python >= 3.10, keeping the
    current pins wherever they still satisfy it (uv reads the existing output file as preferences)."""
    ensure_venv(venv)  # its pip bootstraps uv
    uv = (uv_command(venv) or sys.exit("make lock needs uv: `pip install uv`"))[0]
    # The public index only (not pip's mirrors): resolving for every platform needs every platform's metadata.
    common = [
        "--universal",
        "--python-version=3.10",
        "--no-python-downloads",
        "--custom-compile-command=make lock",
        "-q",
    ]
    run(uv, "pip", "compile", *common, "pyproject.toml", "-o", LOCK, cwd=ROOT)
    extras = ["--extra=browser", "--extra=site"]
    run(uv, "pip", "compile", *common, "pyproject.toml", *extras, "-c", LOCK, "-o", BROWSER_LOCK, cwd=ROOT)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/course.py", description=__doc__.split("\n")[0])
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv", help="the course's venv (default .venv)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("venv", help="create .venv or bring it back to the lock").add_argument(
        "--browser",
        action="store_true",
        help="with Playwright and MkDocs (requirements-browser.txt): site, test-browser",
    )
    sub.add_parser("lab", help="open JupyterLab on notebooks/")
    test = sub.add_parser("test", help="check the venv against the lock, run the tests and every notebook")
    test.add_argument("-j", "--jobs", type=int, default=JOBS, help=f"notebooks run side by side (default {JOBS})")
    test.add_argument("pytest_args", nargs="*", help="instead of the default run (tests and notebooks)")
    sub.add_parser("lock", help="regenerate requirements.txt and requirements-browser.txt with uv")
    for name, (_, what) in COMMANDS.items():
        one = sub.add_parser(name, help=what)
        one.add_argument("names", nargs="*", help="notebooks, e.g. 04 (all by default)")
    sub.add_parser("_differences").add_argument("lock", type=Path)
    args = parser.parse_args(argv)
    if not SUPPORTED_PYTHONS[0] <= sys.version_info[:2] <= SUPPORTED_PYTHONS[1]:
        low, high = (".".join(map(str, v)) for v in SUPPORTED_PYTHONS)
        sys.exit(
            f"The course needs Python {low} to {high}; this is {sys.version.split()[0]} ({sys.executable}). "
            f"Run this script with one of those, e.g. python{high} tools/course.py {args.cmd}, "
            f"or make PYTHON=python{high}."
        )
    venv = args.venv.absolute()
    if args.cmd == "_differences":  # run by the venv's Python (see differences)
        print(json.dumps(compare(locked_versions(args.lock.read_text()), installed_versions())))
        return 0
    if args.cmd == "lock":
        return lock(venv)
    browser = (args.cmd == "venv" and args.browser) or args.cmd == "site"
    py = ensure_venv(venv, browser=browser, exact=args.cmd == "venv")
    if args.cmd in COMMANDS:  # what make progress, execute, sync, check and site run
        return subprocess.run([str(py), "-m", *COMMANDS[args.cmd][0], *args.names], cwd=ROOT).returncode
    if args.cmd == "lab":  # JupyterLab on notebooks/ with the course's settings and start page (tools/lab.py)
        return subprocess.run([str(py), "-m", "tools.lab"], cwd=ROOT).returncode
    if args.cmd == "test":
        if lock_drift(venv) or lint(py):
            return 1
        xdist = ["-n", str(args.jobs), "--dist", "loadfile"] if args.jobs > 1 else []
        return subprocess.run([str(py), "-m", "pytest", *xdist, *args.pytest_args], cwd=ROOT).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
