"""Finding and running the "Exercises (练习)" section of a notebook (``make progress`` and the tests).
Used by no notebook. Lives in utils/ because :mod:`utils.exercises.__main__` (``make progress``)
and the tests run a notebook's exercise section with it.

The section starts at the markdown heading ``## Exercises (练习)`` and ends at ``## Summary``. It
is self-contained: its first code cell imports what the exercises need, so it runs in a fresh
kernel, or in a fresh process here, without the lesson above it. Inside it:

* a **stub cell** starts with ``# ✏️ Exercise N`` — the learner edits it;
* a **check cell** calls ``ex.check(N, ...)``.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import linecache
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jupytext
import nbformat

from utils.exercises import (
    CORRECT,
    LOG_ENV_VAR,
    NOT_ATTEMPTED,
    WRONG,
    Checker,
    failed_stub_message,
    missing_name_message,
    previous_cell_failed,
    reset_stubs,
    stub_error,
    stub_failed,
)
from utils.paths import NOTEBOOKS_DIR, SOURCES_DIR
from utils.syllabus import lessons

HEADING = "## Exercises (练习)"
STUB_RE = re.compile(r"^# ✏️ Exercise (\d+)")
CHECK_RE = re.compile(r"\bex\.check\((\d+)")


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """A notebook from its ``.ipynb`` or its source ``src/NN_topic.py``: whichever of the pair was saved last."""
    path = Path(path)
    source = path.parent / SOURCES_DIR.name / f"{path.stem}.py"
    pair = [p for p in (path, source) if p.exists()]
    if not pair:
        raise FileNotFoundError(f"{path}: no such notebook (nor its source {source})")
    newest = max(pair, key=lambda p: p.stat().st_mtime)
    return jupytext.read(newest)


def exercise_cells(nb: nbformat.NotebookNode, name: str = "notebook") -> list[nbformat.NotebookNode]:
    """The cells from the Exercises heading up to (not including) the Summary heading."""
    starts = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith(HEADING)]
    if len(starts) != 1:
        raise ValueError(f"{name}: expected one '{HEADING}' heading, found {len(starts)}")
    ends = [
        i
        for i, c in enumerate(nb.cells)
        if i > starts[0] and c.cell_type == "markdown" and c.source.lstrip().lower().startswith("## summary")
    ]
    if not ends:
        raise ValueError(f"{name}: no '## Summary' after '{HEADING}'")
    return nb.cells[starts[0] : ends[0]]


def stub_number(source: str) -> int | None:
    m = STUB_RE.match(source)
    return int(m.group(1)) if m else None


def check_number(source: str) -> int | None:
    m = CHECK_RE.search(source)
    return int(m.group(1)) if m else None


def code_sources(cells: list[nbformat.NotebookNode]) -> list[str]:
    return [c.source for c in cells if c.cell_type == "code"]


def run_sources(sources: list[str], namespace: dict | None = None, notebook: str | None = None) -> str:
    """Execute cell sources in one namespace, as a kernel would; return what they printed.

    A cell that raises stops nothing: its exception is printed as one line (a learner's broken stub
    cell must not hide the other exercises). As in JupyterLab (:func:`utils.exercises._watch_cells`), the
    check of a stub whose run raised says so rather than grade an older answer, and a check whose answer was
    never defined says to run the exercise's cell first. A check cell that raises (``ex`` replaced by a stub,
    say) or a cell that calls ``sys.exit()`` is logged as "not yet" for ``make progress`` (``notebook``: its
    number, when ``ex`` is not there to say it).
    """
    namespace = {"__name__": "__exercises__"} if namespace is None else namespace
    out = io.StringIO()
    reset_stubs()  # a fresh namespace: no stub has run in it yet
    with contextlib.redirect_stdout(out):
        for source in sources:
            stub, check = stub_number(source), check_number(source)
            if check is not None and (error := stub_error(check)):
                print(failed_stub_message(check, error))
                _log(check, WRONG, namespace, notebook)
                previous_cell_failed(None)
                continue
            try:
                exec(_compile_cell(source), namespace)
                error = None
            except NameError as exc:
                name = getattr(exc, "name", None)
                if check is not None and name and name != "ex":
                    print(missing_name_message(check, name))
                    _log(check, NOT_ATTEMPTED, namespace, notebook)
                    continue
                error = exc
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001 - reported, as a notebook would (sys.exit() included)
                error = exc
            if error is not None:
                print(f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
                if check is not None:
                    why = f"its check cell raised {type(error).__name__}: {_first_line(error)}"
                    if not isinstance(namespace.get("ex"), Checker):
                        why += " (`ex` was replaced or deleted: run the section's first cell again)"
                    _log(check, "not checked", namespace, notebook, why)
            if stub is not None:
                stub_failed(stub, error)
            previous_cell_failed(error, is_check=check is not None)
    return out.getvalue()


_cells = itertools.count(1)


def _compile_cell(source: str):
    """Compile a cell as IPython does: under a file name of its own whose lines ``linecache`` holds, so that
    ``inspect.getsource`` finds the learner's functions (the checks of :mod:`utils.exercises.rules` read them)."""
    code = _strip_magics(source) + "\n"
    name = f"<cell-{next(_cells)}>"
    linecache.cache[name] = (len(code), None, code.splitlines(keepends=True), name)
    return compile(code, name, "exec")


def _strip_magics(source: str) -> str:
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def _log(number: int, status: str, namespace: dict, notebook: str | None = None, why: str | None = None) -> None:
    log = os.environ.get(LOG_ENV_VAR)
    name = getattr(namespace.get("ex"), "notebook", None) if notebook is None else notebook
    if log and name is not None:
        record = {"notebook": name, "exercise": number, "status": status} | ({"why": why} if why else {})
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0][:200]


class _TimedOut(Exception):
    def __init__(self, records: list[dict]):
        self.records = records


def _run_in_subprocess(path: Path, timeout: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp, "log.jsonl")
        env = dict(os.environ, **{LOG_ENV_VAR: str(log), "MPLBACKEND": "Agg"})
        code = (
            "import sys; from pathlib import Path; from utils.exercises.section import *; "
            "run_sources(code_sources(exercise_cells(read_notebook(Path(sys.argv[1])), sys.argv[1])), "
            "notebook=sys.argv[2])"
        )

        def records() -> list[dict]:
            return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

        try:
            subprocess.run(
                [sys.executable, "-c", code, str(path), path.name[:2]],
                cwd=NOTEBOOKS_DIR,
                env=env,
                timeout=timeout,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                check=True,
                text=True,
            )
        except subprocess.TimeoutExpired:
            raise _TimedOut(records()) from None
        return records()


TIMEOUT = 240
"""Seconds ``make progress`` gives one notebook's exercises (two of them launch 2-process programs)."""


def expected_exercises(path: Path) -> list[int]:
    """The exercise numbers of a saved notebook's check cells (raises with one line when it cannot be read)."""
    try:
        nb = read_notebook(path)
        cells = exercise_cells(nb, path.name)
    except (ValueError, AttributeError, KeyError, TypeError) as exc:  # NotJSONError is a ValueError
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        raise ValueError(
            f"cannot be read ({first}): a half-saved or damaged file? Save it again in JupyterLab, or restore "
            f"the shipped copy with `git checkout -- notebooks/{path.name}` (your answers in it are then lost: "
            "copy them out first)"
        ) from None
    return sorted({n for c in cells if c.cell_type == "code" and (n := check_number(c.source)) is not None})


def progress(names: list[str] | None = None, folder: Path = NOTEBOOKS_DIR, timeout: int = TIMEOUT) -> str:
    """A table of which exercises pass, per notebook, from the notebooks as saved in ``folder``.

    Every exercise of a notebook gets a mark: one whose check left no result (its check cell raised, the
    section stopped early, or ran past ``timeout``) is marked ``?`` and said why under the table."""
    folder = Path(folder)
    chosen = [x for x in lessons() if not names or any(x.ipynb.startswith(n) for n in names)]
    if names and not chosen:
        raise SystemExit(f"no lesson of this course starts with {' or '.join(names)}: give a number such as 01")
    paths = [folder / x.ipynb for x in chosen]
    if folder != NOTEBOOKS_DIR:  # a folder with some of the notebooks (the tests): those it has
        paths = [p for p in paths if p.exists()]
    mark = {CORRECT: "✓", WRONG: "✗", NOT_ATTEMPTED: "○"}
    lines = ["Exercises per notebook: ✓ correct, ✗ not yet, ○ not attempted, ? not checked (see below)", ""]
    notes: list[str] = []
    done = total = 0
    present = [p for p in paths if p.exists()]
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:  # one process each
        results = dict(zip(present, pool.map(lambda p: _records_or_problem(p, timeout), present)))
    for path in paths:
        if not path.exists():
            lines.append(
                f"{path.stem:45s} missing: restore it with `git checkout -- notebooks/{path.name}` "
                "(or copy it from a fresh clone of the course)"
            )
            continue
        try:
            expected = expected_exercises(path)
        except ValueError as exc:
            lines.append(f"{path.stem:45s} {exc}")
            continue
        records, problem = results[path]
        status = {r["exercise"]: r["status"] for r in records}  # the last check of each exercise counts
        why = {r["exercise"]: r.get("why") for r in records}
        notes += [f"{path.stem}: exercise {n}: {why[n]}" for n in sorted(why) if why[n]]
        numbers = sorted(set(expected) | set(status))
        total += len(numbers)
        done += sum(status.get(n) == CORRECT for n in numbers)
        lines.append(f"{path.stem:45s} " + "  ".join(f"{n}{mark.get(status.get(n), '?')}" for n in numbers))
        unchecked = [n for n in numbers if n not in status]
        if unchecked:
            why = problem or "its check cell did not run to the end (was `ex` replaced, or the section stopped?)"
            notes.append(f"{path.stem}: exercise {', '.join(map(str, unchecked))} not checked: {why}")
        elif problem:
            notes.append(f"{path.stem}: {problem}")
    lines += ["", f"{done} of {total} exercises correct."]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)


def _records_or_problem(path: Path, timeout: int) -> tuple[list[dict], str | None]:
    try:
        return _run_in_subprocess(path, timeout), None
    except subprocess.CalledProcessError as exc:
        last = (exc.stderr.strip().splitlines() or ["no message"])[-1]
        return [], f"its exercises could not run: {last.replace(str(path.parent) + os.sep, '')}"
    except _TimedOut as exc:
        return exc.records, f"its exercises ran longer than {timeout} s (a check that never ends? stopped there)"
