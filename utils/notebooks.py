"""Authoring and checking the course notebooks (used by ``make execute`` and the tests).

Each notebook has two files in ``notebooks/``:

* ``NN_topic.py`` — the source, in jupytext's percent format: easy to review and to edit;
* ``NN_topic.ipynb`` — the same cells plus the outputs of one top-to-bottom run, made by
  ``make execute`` (this module's :func:`execute`). nbval re-runs it in ``make test`` and
  compares every cell's output with the stored one.

The run environment (:data:`NOTEBOOK_ENV`) is applied both here and by the test session
(``conftest.py``), so stored outputs and test runs see the same threads, device, plotting
backend and warning filters.

Command line::

    python -m utils.notebooks execute [NAME ...]   # sync .py -> .ipynb and run (all by default)
    python -m utils.notebooks check                # report notebooks that are stale or broken
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

from utils.paths import NOTEBOOKS_DIR

NOTEBOOK_ENV: dict[str, str] = {
    # reference outputs are made on the CPU; `make test-gpu` lifts these two
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
    # any DeprecationWarning or FutureWarning fails the cell that caused it
    "PYTHONWARNINGS": "error::DeprecationWarning,error::FutureWarning",
    # jupyter_core warns (DeprecationWarning) unless it is told to use platformdirs
    "JUPYTER_PLATFORM_DIRS": "1",
    "TORCH_COURSE_NBRUN": "1",
}
"""Environment of every notebook run made by ``make execute`` and ``make test``."""

GPU_ENV_KEYS = ("TORCH_COURSE_DEVICE", "CUDA_VISIBLE_DEVICES")
METADATA_KEY = "torch_course"
CELL_TIMEOUT_S = 600
IGNORE_MARK = "# NBVAL_IGNORE_OUTPUT"


def notebook_env(gpu: bool = False) -> dict[str, str]:
    """The variables of :data:`NOTEBOOK_ENV`; with ``gpu=True`` the device is left to the notebook."""
    env = dict(NOTEBOOK_ENV)
    if gpu:
        for key in GPU_ENV_KEYS:
            env.pop(key)
    return env


def apply_notebook_env(gpu: bool | None = None) -> None:
    """Set :data:`NOTEBOOK_ENV` in ``os.environ`` (kernels started afterwards inherit it).

    ``gpu=None`` reads ``TORCH_COURSE_GPU=1`` from the environment (``make test-gpu``).
    """
    if gpu is None:
        gpu = os.environ.get("TORCH_COURSE_GPU") == "1"
    os.environ.update(notebook_env(gpu))


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


def _minimal_metadata(digest: str) -> dict:
    return {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        METADATA_KEY: {"source_sha256": digest},
    }


def execute(py_path: Path, timeout: int = CELL_TIMEOUT_S) -> tuple[Path, float]:
    """Build ``NN_topic.ipynb`` from ``NN_topic.py`` and run it top to bottom in a fresh kernel.

    The kernel runs with :data:`NOTEBOOK_ENV`, in the notebooks folder. A cell that raises stops
    the run and nothing is written: stored outputs never contain an error. Returns the path of the
    notebook and the seconds the run took.
    """
    py_path = Path(py_path).resolve()
    nb = read_source(py_path)
    digest = source_digest(nb)
    apply_notebook_env(gpu=False)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(py_path.parent)}},
        allow_errors=False,
    )
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    nb.metadata = _minimal_metadata(digest)
    for cell in nb.cells:
        cell.metadata = {}
        if cell.cell_type == "code":
            for out in cell.outputs:
                if "metadata" in out:
                    out.metadata = {}
    out_path = py_path.with_suffix(".ipynb")
    tmp = out_path.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    os.replace(tmp, out_path)  # never leave a half-written notebook
    return out_path, seconds


def check(ipynb_path: Path) -> list[str]:
    """Return the problems of one stored notebook (an empty list when it is good).

    Checked: the ``.py`` source exists and has the same cells; the outputs were made from the
    current source (digest written by :func:`execute`); code cells ran once each, in order,
    in one session; no error output; no DeprecationWarning/FutureWarning text; every code cell
    shows something (compared by nbval) or asserts something; every ``# NBVAL_IGNORE_OUTPUT``
    cell asserts what it shows; at least 80% of code cells are compared.
    """
    ipynb_path = Path(ipynb_path)
    problems: list[str] = []
    nb = nbformat.read(ipynb_path, as_version=4)
    py_path = ipynb_path.with_suffix(".py")
    if not py_path.exists():
        return [f"{py_path.name} is missing: every notebook is authored as a jupytext .py"]
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
            text = out.get("text", "") + str(out.get("data", {}).get("text/plain", ""))
            if re.search(r"DeprecationWarning|FutureWarning", text):
                problems.append(f"{ipynb_path.name} code cell {i}: a DeprecationWarning/FutureWarning is in the output")
        lines = [ln.strip() for ln in cell.source.splitlines()]
        asserts = any(re.match(r"(assert\b|torch\.testing\.assert_close\()", ln) for ln in lines)
        if not cell.get("outputs") and not asserts:
            problems.append(f"{ipynb_path.name} code cell {i}: shows nothing and asserts nothing (print or assert what it does)")
        if IGNORE_MARK in lines:
            ignored += 1
            if not asserts:
                problems.append(f"{ipynb_path.name} code cell {i}: {IGNORE_MARK} without an assert")
        if "# NBVAL_SKIP" in lines:
            problems.append(f"{ipynb_path.name} code cell {i}: NBVAL_SKIP is not used in this course")
    if code and ignored / len(code) > 0.2:
        problems.append(f"{ipynb_path.name}: {ignored} of {len(code)} code cells ignore their output (max 20%)")
    return problems


def _py_sources(names: list[str]) -> list[Path]:
    all_py = sorted(p for p in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.py"))
    if not names:
        return all_py
    chosen = []
    for name in names:
        stem = Path(name).stem
        matches = [p for p in all_py if p.stem.startswith(stem)]  # "03" or "03_dynamic_graphs_and_hooks"
        if not matches:
            raise SystemExit(f"no notebook source matches {name!r} in {NOTEBOOKS_DIR}")
        chosen.extend(m for m in matches if m not in chosen)
    return chosen


def _execute_one(py: Path) -> str:
    path, seconds = execute(py)
    return f"{path.name}: executed in {seconds:.1f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m utils.notebooks", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("execute", help="sync .py -> .ipynb and store fresh outputs")
    ex.add_argument("names", nargs="*", help="notebooks (e.g. 01 or 01_tensors); all by default")
    ex.add_argument("-j", "--jobs", type=int, default=2, help="notebooks run side by side (default 2)")
    sub.add_parser("check", help="list stale or broken notebooks")
    args = parser.parse_args(argv)
    if args.cmd == "execute":
        sources = _py_sources(args.names)
        failed = 0
        with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = {py: pool.submit(_execute_one, py) for py in sources}
            for py, fut in futures.items():
                try:
                    print(fut.result(), flush=True)
                except Exception as err:  # report every failure, then fail
                    failed += 1
                    print(f"{py.name}: FAILED, notebook not written\n{err}", file=sys.stderr, flush=True)
        return 1 if failed else 0
    problems = [p for nb in sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")) for p in check(nb)]
    print("\n".join(problems) or "all notebooks are in sync and cleanly executed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
