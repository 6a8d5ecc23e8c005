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

    python -m tools.notebooks execute [NAME ...]   # .py -> .ipynb, run, store outputs (all by default)
    python -m tools.notebooks sync [NAME ...]      # .py -> .ipynb Markdown only, nothing run (make sync)
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
from tools.syllabus import METADATA_KEY, SETUP_FIRST_LINE, stale, write_generated
from utils.paths import REPO_ROOT, SOURCES_DIR
from utils.syllabus import Lesson, lesson, lessons

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
    # the PyTorch the course teaches ("'at::vec' has not been declared", observed in notebook 11's torch.compile cells).
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
CELL_TIMEOUT_S = 600
"""Longest a notebook cell may run, in make execute and (through conftest.py) under nbval."""
IGNORE_MARK = "# NBVAL_IGNORE_OUTPUT"

STUDY_TIME = re.compile(r"\*\*Study time:\*\* about (\d+) min\b")
"""The study time in a notebook's first cell: the one ``course.toml`` gives the lesson."""
ERRATA_HEADING = "## For readers of the original notes (原笔记勘误)"
"""The closing section of a lesson: what the study notes the course was built from say, and what holds today."""
NOTES_MENTIONS_ALLOWED = 2
"""How often a lesson may say "the notes" above its closing section (e.g. a line of provenance)."""
SHARED_TAG = "shared"
"""The cell tag (``# %% tags=["shared"]`` in the source) of a code cell that tests and benchmarks run too
(:mod:`tools.lesson_code`); the only cell metadata a notebook keeps."""


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
    """SHA-256 of the code cells' sources, in order: what the stored outputs were made from. Markdown does not
    change an output, so a prose edit keeps the digest (``make sync`` copies it into the ``.ipynb``)."""
    h = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            h.update(cell.source.strip().encode() + b"\0")
    return h.hexdigest()


def read_source(py_path: Path) -> nbformat.NotebookNode:
    """Read a percent-format ``.py`` into a notebook with no outputs (a cell keeps only its :data:`SHARED_TAG`)."""
    nb = jupytext.read(py_path, fmt="py:percent")
    for i, cell in enumerate(nb.cells):
        shared = SHARED_TAG in cell.metadata.get("tags", [])
        cell.metadata = {"tags": [SHARED_TAG]} if shared else {}
        cell.id = f"cell-{i:03d}"  # stable ids keep diffs of the .ipynb small
    return nb


def _minimal_metadata(digest: str, seconds: float) -> dict:
    return {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        METADATA_KEY: {"source_sha256": digest, "run_seconds": round(seconds, 1)},
    }


def _write_atomically(nb: nbformat.NotebookNode, out_path: Path) -> None:
    tmp = out_path.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    os.replace(tmp, out_path)  # never leave a half-written notebook
    # jupytext (in JupyterLab) refuses to open a pair whose .ipynb is newer than its .py and differs from it in
    # anything, blank lines between cells included: the source stays the newer file, as it is the source.
    source = source_path(out_path)
    if source.exists():
        os.utime(source, (time.time(), max(time.time(), out_path.stat().st_mtime)))


def execute(py_path: Path, timeout: int = CELL_TIMEOUT_S) -> tuple[Path, float]:
    """Build ``NN_topic.ipynb`` from ``NN_topic.py`` and run it top to bottom in a fresh kernel.

    The kernel runs with :data:`NOTEBOOK_ENV`, in the notebook's folder (the parent of ``src/``). A cell that raises
    stops the run and nothing is written: stored outputs never contain an error. The measured run time goes into
    the notebook's metadata, and from there into the start page (:mod:`tools.syllabus`, rewritten by
    :func:`main`). Returns the path of the notebook and the seconds the run took.
    """
    py_path = Path(py_path).resolve()
    out_path = notebook_path(py_path)
    nb = read_source(py_path)
    apply_notebook_env()  # stored outputs: always the pinned configuration, whatever the caller's environment
    client = _client(nb, out_path.parent, timeout)
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    digest = source_digest(nb)
    if source_digest(read_source(py_path)) != digest:
        raise RuntimeError(f"{py_path.name} was edited while it ran: run make execute again")
    nb.metadata = _minimal_metadata(digest, seconds)
    for cell in nb.cells:
        shared = SHARED_TAG in cell.metadata.get("tags", [])
        cell.metadata = {"tags": [SHARED_TAG]} if shared else {}  # not nbclient's timings
        if cell.cell_type == "code":
            for out in cell.outputs:
                if "metadata" in out:
                    out.metadata = {}
    _write_atomically(nb, out_path)
    return out_path, seconds


def sync(py_path: Path) -> bool:
    """Copy the Markdown of ``NN_topic.py`` into ``NN_topic.ipynb`` without running anything; return whether the
    notebook changed.

    The code cells must be those the stored outputs were made from (same sources, in the same order): each keeps
    its outputs. A changed code cell raises :class:`ValueError` naming it: only ``make execute`` may store outputs.
    """
    py_path = Path(py_path).resolve()
    out_path = notebook_path(py_path)
    if not out_path.exists():
        raise ValueError(f"{out_path.name} does not exist yet: run `make execute NB={py_path.stem[:2]}`")
    try:
        stored = nbformat.read(out_path, as_version=4)
    except Exception as err:  # noqa: BLE001 - a damaged notebook, whatever the parser raised
        raise ValueError(f"{out_path.name} cannot be read ({type(err).__name__}): run `make execute`") from None
    new = read_source(py_path)
    old_code = [c for c in stored.cells if c.cell_type == "code"]
    new_code = [c for c in new.cells if c.cell_type == "code"]
    for i, (a, b) in enumerate(zip(old_code, new_code), 1):
        if a.source.strip() != b.source.strip():
            first = b.source.strip().splitlines()[0] if b.source.strip() else "(empty)"
            raise ValueError(
                f"{py_path.name}: code cell {i} changed ({first[:60]!r}): "
                f"run `make execute NB={py_path.stem[:2]}` to store outputs made from it"
            )
    if len(old_code) != len(new_code):
        raise ValueError(
            f"{py_path.name}: {len(new_code)} code cells, the notebook {len(old_code)}: "
            f"run `make execute NB={py_path.stem[:2]}`"
        )
    for a, b in zip(old_code, new_code):
        b.outputs, b.execution_count = a.outputs, a.execution_count
    new.metadata = stored.metadata
    if [(c.cell_type, c.source, c.get("metadata")) for c in new.cells] == [
        (c.cell_type, c.source, c.get("metadata")) for c in stored.cells
    ] and [c.id for c in new.cells] == [c.get("id") for c in stored.cells]:
        return False
    _write_atomically(new, out_path)
    return True


SECTION_HEADING = re.compile(r"^#{2,3} (\d+(?:\.\d+)?)[.\s]", re.M)
"""A numbered section heading: ``## 4. Title`` or ``### 2.3 Title``."""
SECTION_REF = re.compile(r"(?:§ ?|\b[Ss]ections? )(?P<nums>\d+(?:\.\d+)?(?:(?:, | and | or |–|-| to )\d+(?:\.\d+)?)*)")
"""A reference to a section: ``section 4``, ``§4``, ``sections 2.3–2.6``, ``sections 4 and 6``."""
LESSON_MENTION = re.compile(
    r"\b[Nn]otebook (\d\d)\b(?!\))|\b(\d\d)_\w+\.ipynb\b|(?<![Ss]ection )(?<![Ss]ections )(?<!§)\b(\d\d)'s\b"
)
"""A mention of one lesson that the section references after it in the same sentence point into: ``notebook 04``
(not a closed aside, ``(notebook 04)``), a link to ``04_….ipynb``, or ``04's``."""
SENTENCE_END = re.compile(r"[.!?;](?:\s|$)|\n\s*\n")


def section_numbers(nb: nbformat.NotebookNode) -> set[str]:
    """The numbers of a notebook's numbered section headings (``4``, ``2.3``)."""
    return {n for c in nb.cells if c.cell_type == "markdown" for n in SECTION_HEADING.findall(c.source)}


def dangling_references(text: str, own: str, sections: dict[str, set[str]]) -> list[str]:
    """The section references in ``text`` (written in lesson ``own``) that name no heading: ``'§14'`` or
    ``'notebook 04 §13'``. A reference points into the lesson mentioned last before it in its sentence
    (:data:`LESSON_MENTION`), else into ``own``. ``sections`` maps each lesson's number (``"04"``) to its
    :func:`section_numbers`."""
    out = []
    for m in SECTION_REF.finditer(text):
        before = text[: m.start()]
        ends = list(SENTENCE_END.finditer(before))
        sentence = before[ends[-1].end() :] if ends else before
        mentions = list(LESSON_MENTION.finditer(sentence))
        target = next(g for g in mentions[-1].groups() if g) if mentions else own
        for number in re.split(r", | and | or |–|-| to ", m["nums"]):
            if target not in sections:
                out.append(f"notebook {target} (no such lesson) §{number}")
            elif number not in sections[target]:
                out.append(f"§{number}" if target == own else f"notebook {target} §{number}")
    return out


UNREADABLE = "cannot be read"
"""What :func:`check` says of a notebook that is not valid JSON (a half-saved file)."""


def check(ipynb_path: Path, lesson: Lesson | None = None, sections: dict[str, set[str]] | None = None) -> list[str]:
    """Return the problems of one stored notebook (an empty list when it is good).

    Checked: the ``.py`` source exists and has the same cells; the outputs were made from the current code
    (digest written by :func:`execute`); code cells ran once each, in order, in one session; no error output; no
    DeprecationWarning/FutureWarning on stderr; every code cell shows something (compared by nbval) or asserts
    something (an exercise stub is checked by the cell after it); every ``# NBVAL_IGNORE_OUTPUT`` cell asserts
    what it shows; at least 80% of code cells are compared; a run time was measured. With ``lesson`` (its entry
    in ``course.toml``): the first heading and the study time are the manifest's. With ``sections`` (every
    lesson's :func:`section_numbers`): each "section N" / "notebook NN §M" reference names a real heading.
    """
    ipynb_path = Path(ipynb_path)
    problems: list[str] = []
    py_path = source_path(ipynb_path)
    if not py_path.exists():
        return [f"{py_path} is missing: every notebook is authored as a jupytext .py in src/"]
    try:
        nb = nbformat.read(ipynb_path, as_version=4)
    except Exception as err:  # noqa: BLE001 - a damaged or half-written notebook, whatever the parser raised
        first = (str(err).strip().splitlines() or ["no message"])[0][:120]
        return [
            f"{ipynb_path.name} {UNREADABLE} ({type(err).__name__}: {first}): it is half-saved or damaged; "
            f"`git checkout -- notebooks/{ipynb_path.name}` restores the committed one, "
            f"`make execute NB={ipynb_path.stem[:2]}` writes it again"
        ]
    src = read_source(py_path)
    digest = nb.metadata.get(METADATA_KEY, {}).get("source_sha256")
    if digest != source_digest(nb):
        problems.append(f"{ipynb_path.name}: stored outputs were not made from these cells: run `make execute`")
    elif source_digest(src) != digest:
        problems.append(
            f"{ipynb_path.name}: its stored outputs were not made from the code of {py_path.name}: "
            f"run `make execute NB={ipynb_path.stem[:2]}`"
        )
    elif [(c.cell_type, c.source.strip()) for c in nb.cells] != [(c.cell_type, c.source.strip()) for c in src.cells]:
        problems.append(f"{ipynb_path.name} and {py_path.name} differ in their Markdown: run `make sync`")
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
        # An exercise's stub cell (``# ✏️ Exercise N``) is checked by the cell after it; the setup cell does
        # nothing inside the course (tests/test_opened_alone.py runs it where it does something).
        stub = cell.source.startswith(("# ✏️ Exercise ", SETUP_FIRST_LINE))
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
    if not isinstance(nb.metadata.get(METADATA_KEY, {}).get("run_seconds"), (int, float)):
        problems.append(f"{ipynb_path.name}: no measured run time in its metadata: run `make execute`")
    problems += _structure_problems(src, ipynb_path.name)
    if lesson is not None:
        problems += _manifest_problems(src, ipynb_path.name, lesson)
    if sections is not None:
        own = ipynb_path.name[:2]
        for cell in src.cells:
            problems += [
                f"{ipynb_path.name}: {ref} is referred to, but there is no such section heading"
                for ref in dangling_references(cell.source, own, sections)
            ]
    return problems


def _structure_problems(src: nbformat.NotebookNode, name: str) -> list[str]:
    """A lesson opens with its title, ends with ``## Summary`` (then, if it has one, its closing section for readers
    of the original notes), and says "the notes" at most :data:`NOTES_MENTIONS_ALLOWED` times above that section."""
    problems = []
    headings = [i for i, c in enumerate(src.cells) if c.cell_type == "markdown"]
    summary = [i for i in headings if src.cells[i].source.lstrip().lower().startswith("## summary")]
    errata = [i for i in headings if src.cells[i].source.lstrip().startswith(ERRATA_HEADING)]
    if len(summary) != 1:
        problems.append(f"{name}: needs one '## Summary' section (found {len(summary)})")
    if len(errata) > 1 or (errata and summary and errata[0] < summary[0]):
        problems.append(f"{name}: one '{ERRATA_HEADING}' section, after the summary")
    end = errata[0] if errata else len(src.cells)
    if errata:
        after = [c for c in src.cells[end + 1 :] if c.cell_type == "code" or c.source.lstrip().startswith("## ")]
        if after:
            problems.append(f"{name}: the section '{ERRATA_HEADING}' is the last one")
        said = sum(len(re.findall(r"\bthe notes\b", c.source, re.I)) for c in src.cells[:end])
        if said > NOTES_MENTIONS_ALLOWED:
            problems.append(
                f"{name}: says 'the notes' {said} times above its closing section (at most "
                f"{NOTES_MENTIONS_ALLOWED}): teach in the course's own voice, and move the errata into the table"
            )
    return problems


def _manifest_problems(src: nbformat.NotebookNode, name: str, lesson: Lesson) -> list[str]:
    """Where the notebook's first cell disagrees with its entry in ``course.toml``."""
    first = src.cells[0].source if src.cells and src.cells[0].cell_type == "markdown" else ""
    title = first.splitlines()[0] if first else ""
    problems = []
    if not (title == f"# {lesson.heading}" or title.startswith(f"# {lesson.heading}:")):
        problems.append(f"{name}: its first line is {title!r}, course.toml makes it '# {lesson.heading}'")
    study = STUDY_TIME.findall(first)
    if study != [str(lesson.study_minutes)]:
        problems.append(
            f"{name}: the first cell should say '**Study time:** about {lesson.study_minutes} min' once, as "
            f"course.toml does (it says {', '.join(study) or 'none'})"
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
    """The sources of the lessons named (``03`` or ``03_dynamic_graphs_and_hooks``), all by default."""
    if not names:
        return [x.source for x in lessons()]
    chosen = []
    for name in names:
        try:
            found = lesson(Path(name).stem)
        except LookupError as err:
            unlisted = sorted(SOURCES_DIR.glob(f"{Path(name).stem}*.py"))
            message = (  # a new lesson: say what is missing, not only that it is unknown (probe R3)
                f"{unlisted[0].relative_to(REPO_ROOT)} is not a lesson of course.toml yet: add a [[lessons]] "
                "entry for it, then run this again (nothing was run or written)"
                if unlisted
                else str(err)
            )
            raise SystemExit(message) from None
        if found.source not in chosen:
            chosen.append(found.source)
    return chosen


def _execute_one(py: Path) -> tuple[str, float]:
    path, seconds = execute(py)
    return path.name, seconds


def check_all() -> list[str]:
    """Every problem of the course's notebooks (:func:`check` with the manifest), sources that are not in
    ``course.toml``, and generated pages that are out of date."""
    course_lessons = lessons()
    sections = {x.nn: section_numbers(read_source(x.source)) for x in course_lessons if x.source.exists()}
    problems = []
    for x in course_lessons:
        if not x.source.exists():
            problems.append(f"course.toml lists lesson {x.nn}, but {x.source.relative_to(REPO_ROOT)} does not exist")
        elif not x.notebook.exists():
            problems.append(f"{x.ipynb} does not exist: run `make execute NB={x.nn}`")
        else:
            problems += check(x.notebook, x, sections)
    known = {x.source.name for x in course_lessons}
    for py in sorted(SOURCES_DIR.glob("*.py")):
        if py.name not in known:
            problems.append(
                f"{py.relative_to(REPO_ROOT)} is not a lesson of course.toml: add a [[lessons]] entry for it "
                "(or move it out of notebooks/src/)"
            )
    if not any(UNREADABLE in p for p in problems):  # else the page only lacks that notebook's run time (probe R4)
        problems += [f"{path.relative_to(REPO_ROOT)} is out of date: run `make sync`" for path in stale()]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.notebooks", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("execute", help="sync .py -> .ipynb and store fresh outputs")
    ex.add_argument("names", nargs="*", help="notebooks (e.g. 01 or 01_tensors); all by default")
    ex.add_argument("-j", "--jobs", type=int, default=JOBS, help=f"notebooks run side by side (default {JOBS})")
    sy = sub.add_parser("sync", help="copy Markdown from the .py sources into the .ipynb, run nothing")
    sy.add_argument("names", nargs="*", help="notebooks (e.g. 01 or 01_tensors); all by default")
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
                    print(f"{name}: executed in {seconds:.1f} s", flush=True)
                except Exception as err:  # report every failure, then fail
                    failed += 1
                    print(f"{py.name}: FAILED, notebook not written\n{err}", file=sys.stderr, flush=True)
        for path in write_generated():  # the start page shows the measured run times
            print(f"rewrote {path.relative_to(REPO_ROOT)}")
        return 1 if failed else 0
    if args.cmd == "sync":
        failed = 0
        for py in _py_sources(args.names):
            try:
                print(f"{notebook_path(py).name}: {'Markdown copied' if sync(py) else 'in sync'}", flush=True)
            except ValueError as err:
                failed += 1
                print(f"{py.name}: not synced: {err}", file=sys.stderr, flush=True)
        for path in write_generated():
            print(f"rewrote {path.relative_to(REPO_ROOT)}")
        return 1 if failed else 0
    problems = check_all()
    print("\n".join(problems) or "all notebooks are in sync and cleanly executed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
