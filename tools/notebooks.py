"""Authoring and checking the course notebooks.
Run by ``make execute``, ``make check``, ``make test-learner``, ``conftest.py`` and ``tests/test_notebooks.py``.

Each notebook has two files, paired by jupytext (``jupytext.toml``):

* ``notebooks/src/NN_topic.py`` — the source, in jupytext's percent format: easy to review and to edit;
* ``notebooks/NN_topic.ipynb`` — the same cells plus the outputs of one top-to-bottom run, made by
  ``make execute`` (this module's :func:`execute`). nbval re-runs it in ``make test`` and
  compares every cell's output with the stored one. A learner sees only these in JupyterLab.

The run environment (:data:`NOTEBOOK_ENV`) is applied both here and by the test session
(``conftest.py``), so stored outputs and test runs see the same threads, device, plotting
backend and warning filters.

Command line::

    python -m tools.notebooks execute [NAME ...]   # sync .py -> .ipynb and run (all by default)
    python -m tools.notebooks check                # report notebooks that are stale or broken
    python -m tools.notebooks learner [NAME ...]   # run them as a learner does (make test-learner)
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import os
import platform
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

from tools.course import JOBS
from tools.lab import write_start_page
from utils.paths import NOTEBOOKS_DIR, SOURCES_DIR

NOTEBOOK_ENV: dict[str, str] = {
    # reference outputs are made on the CPU; `make test-lax` and `make test-gpu` lift these two
    "TORCH_COURSE_DEVICE": "cpu",
    "CUDA_VISIBLE_DEVICES": "",
    # one thread per notebook: two notebooks run side by side on the two cores, and
    # floating-point reductions do not depend on how many cores a machine has
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "PYTHONHASHSEED": "0",
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    # progress bars are for people; under nbval they would be different every run
    "TQDM_DISABLE": "1",
    # any DeprecationWarning or FutureWarning fails the cell that caused it. Ignored, as no lesson's:
    # on Python 3.12+ the kernel's own start-up warns (tornado's IOLoop.current() calls
    # asyncio.get_event_loop() before any loop is set), which would kill every kernel; on 3.13.0
    # torch.compile warns that its guards run slower than on 3.13.1+.
    "PYTHONWARNINGS": "error::DeprecationWarning,error::FutureWarning,"
    "ignore:There is no current event loop:DeprecationWarning:tornado.ioloop,"
    "ignore:Guards may run slower on Python 3.13.0:RuntimeWarning",
    # Python 3.13+ colours tracebacks when FORCE_COLOR is set, and ipykernel sets it for the
    # kernel's subprocesses: a child's error text, printed by a cell, would carry escape codes
    "PYTHON_COLORS": "0",
    # jupyter_core warns (DeprecationWarning) unless it is told to use platformdirs
    "JUPYTER_PLATFORM_DIRS": "1",
}
"""Environment of every notebook run made by ``make execute`` and ``make test``."""

PINNED_X86_NUMERICS: dict[str, str] = {
    # The same code paths on every x86-64 machine with AVX2, whatever wider instructions (AVX-512,
    # AMX) it also has: ATen's vectorised kernels, and the vector ISA of the C++ that Inductor
    # generates (it reads the same variable), with the compiler told the same instruction set
    # instead of -march=native; MKL's conditional numerical reproducibility (CNR) mode, on its AVX2
    # branch on Intel CPUs (other vendors' CPUs get MKL's AUTO branch, with CNR still on); oneDNN's
    # kernels capped at AVX2. oneDNN, FBGEMM (int8) and NumPy still size or pick some kernels by
    # CPU, so printed values are also kept robust (README: "Which outputs are compared").
    "ATEN_CPU_CAPABILITY": "avx2",
    "TORCHINDUCTOR_CPP_MARCH": "x86-64-v3",
    "MKL_CBWR": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}
"""Added to :data:`NOTEBOOK_ENV` on x86-64 machines with AVX2 (:func:`_x86_with_avx2`).

Not on ARM, where ``ATEN_CPU_CAPABILITY`` names other kernels (``sve256``, ...) and ``avx2`` would
only make Inductor warn; not on an x86 CPU without AVX2, which cannot run those kernels.
"""

PORTABLE_CONFIGS: dict[str, dict[str, str | None]] = {
    # The math libraries on their narrowest code paths: MKL's SSE2-compatible BLAS (other blocking,
    # other summation order) and oneDNN's kernels capped at SSE4.1. ATen stays on AVX2:
    # with ATEN_CPU_CAPABILITY=default, Inductor generates scalar C++ that does not compile in
    # PyTorch 2.14 ("'at::vec' has not been declared", observed in notebook 11's torch.compile cells).
    "narrow-isa": {"MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    # Two threads, and MKL and oneDNN unpinned (None removes the variable: MKL without CNR, oneDNN
    # on the widest ISA it finds), as on a learner's machine: reductions, matrix products and
    # convolutions are split across threads.
    "two-threads": {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "MKL_CBWR": None, "ONEDNN_MAX_CPU_ISA": None},
}
"""Numeric configurations of ``make test-portable``: each must reproduce every compared output."""


def source_path(ipynb_path: Path) -> Path:
    """``<folder>/src/NN_topic.py``, the source of ``<folder>/NN_topic.ipynb``."""
    return ipynb_path.parent / SOURCES_DIR.name / f"{ipynb_path.stem}.py"


def notebook_path(py_path: Path) -> Path:
    """``<folder>/NN_topic.ipynb``, the notebook built from ``<folder>/src/NN_topic.py``."""
    return py_path.parent.parent / f"{py_path.stem}.ipynb"


NUMERICS_ENV_VAR = "TORCH_COURSE_NUMERICS"
GPU_ENV_VAR = "TORCH_COURSE_GPU"

GPU_ENV_KEYS = ("TORCH_COURSE_DEVICE", "CUDA_VISIBLE_DEVICES")
METADATA_KEY = "torch_course"
CELL_TIMEOUT_S = 600
"""Longest a notebook cell may run, in make execute and (through conftest.py) under nbval."""
IGNORE_MARK = "# NBVAL_IGNORE_OUTPUT"
README = NOTEBOOKS_DIR.parent / "README.md"

RUN_TIME = re.compile(r"\*\*Run time:\*\* (\d+) s\b")
"""The run time in a notebook's first cell, written there by :func:`execute` from its own measurement."""
STUDY_TIME = re.compile(r"\*\*Study time:\*\* about (\d+) min\b")
"""The study time in a notebook's first cell (written by its author; the README repeats it)."""
README_TIMES = re.compile(r"\| (?P<study>\d+) min \| (?P<run>\d+) s(?P<mark>[¹²³⁴]?) \|")
"""The study-time and run-time cells of a notebook's row in the README's syllabus table."""


def shown_seconds(seconds: float) -> int:
    """How a measured run time is shown: to 5 s below 100 s, to 10 s above (runs vary by about 10%)."""
    step = 5 if seconds < 100 else 10
    return max(step, step * round(seconds / step))


def set_run_time(text: str, seconds: int, where: str) -> str:
    """``text`` with the number of its one ``**Run time:** N s`` replaced by ``seconds``."""
    found = RUN_TIME.findall(text)
    if len(found) != 1:
        raise ValueError(
            f"{where}: the first cell needs exactly one '**Run time:** N s' "
            f"(found {len(found)}); make execute writes the measured N there"
        )
    return RUN_TIME.sub(f"**Run time:** {seconds} s", text, count=1)


def readme_row(readme: str, ipynb_name: str) -> str:
    """The README syllabus row that links to ``notebooks/<ipynb_name>``."""
    rows = [ln for ln in readme.splitlines() if ln.startswith("|") and f"(notebooks/{ipynb_name})" in ln]
    if len(rows) != 1:
        raise ValueError(f"README.md: {len(rows)} syllabus rows link to notebooks/{ipynb_name} (need exactly 1)")
    return rows[0]


def readme_times(readme: str, ipynb_name: str) -> tuple[int, int]:
    """(study minutes, run seconds) as the README's syllabus row for ``ipynb_name`` states them."""
    row = readme_row(readme, ipynb_name)
    found = list(README_TIMES.finditer(row))
    if len(found) != 1:
        raise ValueError(f"README.md: the row of {ipynb_name} needs one '| N min | N s |' pair of cells")
    return int(found[0]["study"]), int(found[0]["run"])


def set_readme_run_time(readme: str, ipynb_name: str, seconds: int) -> str:
    """``readme`` with the run-time cell of ``ipynb_name``'s syllabus row set to ``seconds``."""
    row = readme_row(readme, ipynb_name)
    readme_times(readme, ipynb_name)  # exactly one pair of time cells
    new = README_TIMES.sub(lambda m: f"| {m['study']} min | {seconds} s{m['mark']} |", row)
    return readme.replace(row, new)


def _x86_with_avx2() -> bool:
    """Whether this is an x86-64 machine whose CPU has AVX2 and FMA (the pinned code paths)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        flags = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
    except (OSError, StopIteration):
        return True  # no /proc/cpuinfo (not Linux): assume a CPU of this decade
    return {"avx2", "fma"} <= set(flags.split())


def notebook_env(gpu: bool = False, numerics: str | None = None) -> dict[str, str]:
    """The variables of :data:`NOTEBOOK_ENV` plus the pinned x86-64 numerics.

    With ``gpu=True`` the device is left to the notebook. ``numerics`` names one of
    :data:`PORTABLE_CONFIGS`, laid over the pinned configuration (``make test-portable``).
    """
    env = dict(NOTEBOOK_ENV)
    if _x86_with_avx2():
        env.update(PINNED_X86_NUMERICS)
    if gpu:
        for key in GPU_ENV_KEYS:
            env.pop(key)
    if numerics:
        if numerics not in PORTABLE_CONFIGS:
            raise ValueError(f"{NUMERICS_ENV_VAR}={numerics!r} is not one of {', '.join(PORTABLE_CONFIGS)}")
        for key, value in PORTABLE_CONFIGS[numerics].items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
    return env


def apply_notebook_env(gpu: bool = False, numerics: str | None = None) -> None:
    """Set :func:`notebook_env` in ``os.environ`` (kernels started afterwards inherit it).

    Pinned variables that the numeric configuration removes are removed from ``os.environ`` too.
    """
    env = notebook_env(gpu, numerics)
    for key in PINNED_X86_NUMERICS:
        if key not in env:
            os.environ.pop(key, None)
    os.environ.update(env)


def apply_test_env() -> None:
    """:func:`apply_notebook_env` as the test targets ask for it (``conftest.py``).

    ``TORCH_COURSE_GPU=1`` leaves the device to the notebooks (``make test-lax``);
    ``TORCH_COURSE_NUMERICS`` names a configuration of :data:`PORTABLE_CONFIGS` (``make test-portable``).
    """
    apply_notebook_env(os.environ.get(GPU_ENV_VAR) == "1", os.environ.get(NUMERICS_ENV_VAR) or None)


def _client(nb: nbformat.NotebookNode, folder: Path, timeout: int) -> NotebookClient:
    """A client that runs ``nb`` top to bottom in a fresh kernel started in ``folder``, stopping at an error."""
    return NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(folder)}}, allow_errors=False
    )


def source_digest(nb: nbformat.NotebookNode) -> str:
    """SHA-256 of the cell types and sources: what the stored outputs were made from."""
    h = hashlib.sha256()
    for cell in nb.cells:
        h.update(cell.cell_type.encode() + b"\0" + cell.source.strip().encode() + b"\0")
    return h.hexdigest()


def read_source(py_path: Path) -> nbformat.NotebookNode:
    """Read a percent-format ``.py`` into a notebook with no outputs."""
    nb = jupytext.read(py_path, fmt="py:percent")
    for i, cell in enumerate(nb.cells):
        cell.metadata = {}
        cell.id = f"cell-{i:03d}"  # stable ids keep diffs of the .ipynb small
    return nb


def _minimal_metadata(digest: str, seconds: float) -> dict:
    return {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        METADATA_KEY: {"source_sha256": digest, "run_seconds": round(seconds, 1)},
    }


def execute(py_path: Path, timeout: int = CELL_TIMEOUT_S) -> tuple[Path, float]:
    """Build ``NN_topic.ipynb`` from ``NN_topic.py`` and run it top to bottom in a fresh kernel.

    The kernel runs with :data:`NOTEBOOK_ENV`, in the notebook's folder (the parent of ``src/``). A cell that raises
    stops the run and nothing is written: stored outputs never contain an error. The measured run time
    (:func:`shown_seconds`) is written into the ``**Run time:** N s`` of the first cell, in the
    ``.py`` source and the notebook alike, and the seconds into the notebook's metadata; the
    README's syllabus row is updated by :func:`main`. Returns the path of the notebook and the
    seconds the run took.
    """
    py_path = Path(py_path).resolve()
    out_path = notebook_path(py_path)
    nb = read_source(py_path)
    set_run_time(nb.cells[0].source, 0, py_path.name)  # fail before a long run, not after it
    apply_notebook_env()  # stored outputs: always the pinned configuration, whatever the caller's environment
    client = _client(nb, out_path.parent, timeout)
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    shown = shown_seconds(seconds)
    nb.cells[0].source = set_run_time(nb.cells[0].source, shown, py_path.name)
    py_text = py_path.read_text()
    py_path.write_text(set_run_time(py_text, shown, py_path.name))
    digest = source_digest(nb)
    if source_digest(read_source(py_path)) != digest:
        raise RuntimeError(f"{py_path.name} was edited while it ran: run make execute again")
    nb.metadata = _minimal_metadata(digest, seconds)
    for cell in nb.cells:
        cell.metadata = {}
        if cell.cell_type == "code":
            for out in cell.outputs:
                if "metadata" in out:
                    out.metadata = {}
    tmp = out_path.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    os.replace(tmp, out_path)  # never leave a half-written notebook
    return out_path, seconds


def check(ipynb_path: Path, readme: Path = README) -> list[str]:
    """Return the problems of one stored notebook (an empty list when it is good).

    Checked: the ``.py`` source exists and has the same cells; the outputs were made from the
    current source (digest written by :func:`execute`); code cells ran once each, in order,
    in one session; no error output; no DeprecationWarning/FutureWarning on stderr; every code cell shows something
    (compared by nbval) or asserts something (an exercise stub is checked by the cell after it); every ``#
    NBVAL_IGNORE_OUTPUT`` cell asserts what it shows; at least 80% of code cells are compared; the first cell's
    run time is the one measured by :func:`execute`, and its study and run times are those of the README
    syllabus (``readme``).
    """
    ipynb_path = Path(ipynb_path)
    problems: list[str] = []
    nb = nbformat.read(ipynb_path, as_version=4)
    py_path = source_path(ipynb_path)
    if not py_path.exists():
        return [f"{py_path} is missing: every notebook is authored as a jupytext .py in src/"]
    src = read_source(py_path)
    stored = [(c.cell_type, c.source.strip()) for c in nb.cells]
    wanted = [(c.cell_type, c.source.strip()) for c in src.cells]
    if stored != wanted:
        problems.append(f"{ipynb_path.name} and {py_path.name} differ: run `make execute NB={ipynb_path.stem}`")
    digest = nb.metadata.get(METADATA_KEY, {}).get("source_sha256")
    if digest != source_digest(nb):
        problems.append(f"{ipynb_path.name}: stored outputs were not made from these cells: run `make execute`")
    code = [c for c in nb.cells if c.cell_type == "code"]
    counts = [c.get("execution_count") for c in code]
    if counts != list(range(1, len(code) + 1)):
        problems.append(f"{ipynb_path.name}: execution counts {counts} are not 1..{len(code)} (not one clean run)")
    ignored = 0
    for i, cell in enumerate(code, 1):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                problems.append(f"{ipynb_path.name} code cell {i}: stored error output {out.get('ename')}")
            # A warning that escaped to stderr; a warning the lesson teaches is caught and printed by the cell.
            text = out.get("text", "") if out.get("name") == "stderr" else ""
            if re.search(r"DeprecationWarning|FutureWarning", text):
                problems.append(
                    f"{ipynb_path.name} code cell {i}: a DeprecationWarning/FutureWarning escaped to stderr"
                )
        lines = [ln.strip() for ln in cell.source.splitlines()]
        asserts = any(re.match(r"(assert\b|torch\.testing\.assert_close\()", ln) for ln in lines)
        # An exercise's stub cell (``# ✏️ Exercise N``) is checked by the cell after it.
        stub = cell.source.startswith("# ✏️ Exercise ")
        if not cell.get("outputs") and not asserts and not stub:
            problems.append(
                f"{ipynb_path.name} code cell {i}: shows nothing and asserts nothing (print or assert what it does)"
            )
        if IGNORE_MARK in lines:
            ignored += 1
            if not asserts:
                problems.append(f"{ipynb_path.name} code cell {i}: {IGNORE_MARK} without an assert")
        if "# NBVAL_SKIP" in lines:
            problems.append(f"{ipynb_path.name} code cell {i}: NBVAL_SKIP is not used in this course")
    if code and ignored / len(code) > 0.2:
        problems.append(f"{ipynb_path.name}: {ignored} of {len(code)} code cells ignore their output (max 20%)")
    problems += _time_problems(nb, ipynb_path.name, readme)
    return problems


def _time_problems(nb: nbformat.NotebookNode, name: str, readme: Path = README) -> list[str]:
    """Disagreements between the measured run time, the first cell's times and the README's syllabus."""
    first = nb.cells[0].source if nb.cells else ""
    run, study = RUN_TIME.findall(first), STUDY_TIME.findall(first)
    if len(run) != 1 or len(study) != 1:
        return [f"{name}: the first cell needs one '**Study time:** about N min' and one '**Run time:** N s'"]
    problems = []
    measured = nb.metadata.get(METADATA_KEY, {}).get("run_seconds")
    if measured is None or int(run[0]) != shown_seconds(measured):
        problems.append(f"{name}: '**Run time:** {run[0]} s' is not the measured {measured} s: run `make execute`")
    try:
        in_readme = readme_times(readme.read_text(), name)
    except (OSError, ValueError) as err:
        return problems + [str(err)]
    if in_readme != (int(study[0]), int(run[0])):
        problems.append(
            f"{name}: README.md says {in_readme[0]} min / {in_readme[1]} s, the notebook "
            f"{study[0]} min / {run[0]} s: run `make execute` (run time) or fix the README (study time)"
        )
    return problems


WARNING_LINE = re.compile(r"\b\w*(Warning|warn)\b[:(]")


WARNING_PLACE = re.compile(r"^.*?\.py:\d+: |0x[0-9a-fA-F]+|/tmp/\S+")


def _warning_lines(cell: nbformat.NotebookNode) -> set[str]:
    """The lines of a cell's text outputs that report a warning (``...Warning: ...``).

    The place a warning comes from (``/tmp/ipykernel_123/456.py:7: ``), addresses and temporary
    paths differ from run to run and are cut off, so the same warning compares equal.
    """
    lines = set()
    for out in cell.get("outputs", []):
        text = out.get("text", "") + str(out.get("data", {}).get("text/plain", ""))
        lines.update(WARNING_PLACE.sub("", ln.strip()) for ln in text.splitlines() if WARNING_LINE.search(ln))
    return lines


def learner_env() -> dict[str, str]:
    """The environment of a learner's kernel: this process's, without anything the tests pin.

    Every variable of :func:`notebook_env` and of :data:`PORTABLE_CONFIGS` is removed (all cores,
    the best device, native numeric code paths) except the plotting backend, which changes nothing
    a learner can check. Warnings are shown: ``PYTHONWARNINGS=default`` prints every warning once
    per place, including the ResourceWarnings and DeprecationWarnings from libraries that Python
    and JupyterLab hide by default: stricter than a default JupyterLab, as a learner running
    with ``-X dev`` or ``PYTHONWARNINGS=default`` sees it. Settings of the user's own that the
    tests also pin (``OMP_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES``, ...) are removed too.
    """
    pinned = set(notebook_env()) | {k for cfg in PORTABLE_CONFIGS.values() for k in cfg}
    pinned |= {NUMERICS_ENV_VAR, GPU_ENV_VAR}
    env = {k: v for k, v in os.environ.items() if k not in pinned}
    env.update(MPLBACKEND=NOTEBOOK_ENV["MPLBACKEND"], JUPYTER_PLATFORM_DIRS="1", PYTHONWARNINGS="default")
    return env


def run_as_learner(ipynb_path: Path, timeout: int = CELL_TIMEOUT_S) -> tuple[list[str], float]:
    """Run a stored notebook the way a learner does and return its problems and its run time.

    The kernel starts in the notebook's folder with :func:`learner_env`; outputs are not compared.
    A problem is an error in a cell (the run stops there) or a warning printed by a cell whose
    stored output does not show it: what a learner sees must be what the lesson shows.
    """
    ipynb_path = Path(ipynb_path).resolve()
    stored = nbformat.read(ipynb_path, as_version=4)
    nb = copy.deepcopy(stored)
    client = _client(nb, ipynb_path.parent, timeout)
    start = time.perf_counter()
    problems: list[str] = []
    try:
        client.execute(env=learner_env())
    except Exception as err:  # noqa: BLE001 - report the failing cell, whatever it raised
        problems.append(f"{ipynb_path.name}: {type(err).__name__}: {str(err)[-2000:]}")
    seconds = time.perf_counter() - start
    code = [(a, b) for a, b in zip(stored.cells, nb.cells) if a.cell_type == "code"]
    for i, (old, new) in enumerate(code, 1):
        for line in sorted(_warning_lines(new) - _warning_lines(old)):
            problems.append(
                f"{ipynb_path.name} code cell {i}: a learner sees a warning the lesson does not show: {line[:300]}"
            )
    return problems, seconds


def _py_sources(names: list[str]) -> list[Path]:
    all_py = sorted(SOURCES_DIR.glob("[0-9][0-9]_*.py"))
    if not names:
        return all_py
    chosen = []
    for name in names:
        stem = Path(name).stem
        matches = [p for p in all_py if p.stem.startswith(stem)]  # "03" or "03_dynamic_graphs_and_hooks"
        if not matches:
            raise SystemExit(f"no notebook source matches {name!r} in {SOURCES_DIR}")
        chosen.extend(m for m in matches if m not in chosen)
    return chosen


def _execute_one(py: Path) -> tuple[str, float]:
    path, seconds = execute(py)
    return path.name, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.notebooks", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("execute", help="sync .py -> .ipynb and store fresh outputs")
    ex.add_argument("names", nargs="*", help="notebooks (e.g. 01 or 01_tensors); all by default")
    ex.add_argument("-j", "--jobs", type=int, default=JOBS, help=f"notebooks run side by side (default {JOBS})")
    sub.add_parser("check", help="list stale or broken notebooks")
    le = sub.add_parser("learner", help="run notebooks as a learner does: all cores, warnings shown, no comparison")
    le.add_argument("names", nargs="*", help="notebooks (e.g. 01 or 01_tensors); all by default")
    args = parser.parse_args(argv)
    if args.cmd == "learner":
        failed = 0
        total = time.perf_counter()
        sources = _py_sources(args.names)
        for py in sources:
            ipynb = notebook_path(py)
            if not ipynb.exists():
                problems, seconds = [f"{ipynb.name} is missing: run `make execute NB={py.stem}`"], 0.0
            else:
                problems, seconds = run_as_learner(ipynb)
            failed += bool(problems)
            print(f"{ipynb.name}: {'FAILED' if problems else 'passed'} in {seconds:.0f} s", flush=True)
            for problem in problems:
                print("  " + problem, flush=True)
        print(f"{failed} failed, {len(sources) - failed} passed in {time.perf_counter() - total:.0f} s")
        return 1 if failed else 0
    if args.cmd == "execute":
        sources = _py_sources(args.names)
        failed = 0
        with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = {py: pool.submit(_execute_one, py) for py in sources}
            for py, fut in futures.items():
                try:
                    name, seconds = fut.result()
                    README.write_text(set_readme_run_time(README.read_text(), name, shown_seconds(seconds)))
                    print(
                        f"{name}: executed in {seconds:.1f} s (README and first cell: {shown_seconds(seconds)} s)",
                        flush=True,
                    )
                except Exception as err:  # report every failure, then fail
                    failed += 1
                    print(f"{py.name}: FAILED, notebook not written\n{err}", file=sys.stderr, flush=True)
        write_start_page()  # it shows the README's run times
        return 1 if failed else 0
    problems = [p for nb in sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")) for p in check(nb)]
    print("\n".join(problems) or "all notebooks are in sync and cleanly executed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
