"""The exercises at the end of every notebook: stubs, checks, hints and the teachers' solutions.

For each notebook, the "Exercises (练习)" section is run in-process (it is self-contained, see
``utils/exercises/section.py``) three ways: as shipped (every check says "not attempted yet"), with
every stub replaced by its solution from ``solutions/NN_topic.md`` (every check says "correct"), and
with one stub replaced by each known-wrong answer (its check says "not yet" with the expected hint).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import jupytext
import nbformat
import pytest

from tools.notebooks import notebook_path
from utils.exercises import CORRECT, KNOWN_ERRORS, NOT_ATTEMPTED, WRONG, Checker, Registry, hint, judge, returns
from utils.exercises.section import (
    check_number,
    code_sources,
    exercise_cells,
    progress,
    read_notebook,
    run_sources,
    stub_number,
)
from utils.paths import REPO_ROOT
from utils.syllabus import lesson, lessons

SOLUTIONS_DIR = REPO_ROOT / "solutions"
needs_solutions = pytest.mark.skipif(
    not SOLUTIONS_DIR.is_dir(), reason="no solutions/: the course as handed out to learners (README, Exercises)"
)
SOURCES = [x.source for x in lessons()]
FENCE = re.compile(r"^```python (solution|wrong)(?: ([^\n]*))?\n(.*?)^```", re.M | re.S)


def solutions(stem: str) -> dict[int, dict[str, list]]:
    """``{exercise: {"solution": [code], "wrong": [(code, expected hint)]}}`` from ``solutions/<stem>.md``."""
    text = (SOLUTIONS_DIR / f"{stem}.md").read_text(encoding="utf-8")
    found: dict[int, dict[str, list]] = {}
    for part in re.split(r"^(?=## Exercise \d+)", text, flags=re.M)[1:]:
        number = int(re.match(r"## Exercise (\d+)", part).group(1))
        entry = found.setdefault(number, {"solution": [], "wrong": []})
        for kind, info, code in FENCE.findall(part):
            entry["solution"].append(code) if kind == "solution" else entry["wrong"].append((code, json.loads(info)))
    return found


def section(py: Path) -> list[str]:
    return code_sources(exercise_cells(jupytext.read(py), py.name))


def replaced(sources: list[str], replacements: dict[int, str]) -> list[str]:
    return [replacements.get(stub_number(s), s) if stub_number(s) is not None else s for s in sources]


def check_lines(output: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(0) for m in re.finditer(r"^Exercise (\d+) \(练习 \d+\): .*$", output, re.M)}


@pytest.fixture(params=SOURCES, ids=lambda p: p.stem)
def py(request) -> Path:
    return request.param


@needs_solutions
def test_every_notebook_has_three_exercises_each_with_a_stub_a_check_and_a_solution(py):
    sources = section(py)
    stubs = [stub_number(s) for s in sources if stub_number(s) is not None]
    checks = [check_number(s) for s in sources if check_number(s) is not None]
    assert len(stubs) >= 3, f"{py.name}: {len(stubs)} exercises, at least 3 wanted"
    assert stubs == checks == list(range(1, len(stubs) + 1)), f"{py.name}: stubs {stubs}, checks {checks}"
    for i, s in enumerate(sources):  # each check cell comes right after its stub
        if check_number(s) is not None:
            assert stub_number(sources[i - 1]) == check_number(s), (
                f"{py.name}: check {check_number(s)} not after its stub"
            )
    registry: Registry = Checker(py.stem[:2], quiet=True).registry
    assert sorted(registry.exercises) == stubs
    found = solutions(py.stem)
    assert sorted(found) == stubs, f"solutions/{py.stem}.md covers exercises {sorted(found)}"
    for number, entry in found.items():
        assert len(entry["solution"]) >= 1, f"exercise {number}: no solution"
        assert len(entry["wrong"]) >= 1, f"exercise {number}: no known-wrong answer"


@functools.cache
def headings(stem_prefix: str) -> list[str]:
    nb = jupytext.read(lesson(stem_prefix).source)
    return [
        ln.lstrip("#").strip()
        for c in nb.cells
        if c.cell_type == "markdown"
        for ln in c.source.splitlines()
        if re.match(r"#{2,3} ", ln)
    ]


def _missing(part: str, notebook: str) -> bool:
    m = re.match(r"(\d\d) · (.*)", part)
    nb, heading = (m.group(1), m.group(2)) if m else (notebook, part)
    return not any(h.startswith(heading) for h in headings(nb))  # the Chinese term in brackets may be left out


def sections_exist(section: str, notebook: str) -> list[str]:
    """The parts of a "re-read" section that are not a heading of their notebook ("NN · heading" or this one's)."""
    parts = [section] if not _missing(section, notebook) else section.split("; ")
    return [part for part in parts if _missing(part, notebook)]


def test_every_section_to_re_read_is_a_heading(py):
    registry: Registry = Checker(py.stem[:2], quiet=True).registry
    for ex in registry.exercises.values():
        assert not sections_exist(ex.section, registry.notebook), f"exercise {ex.number}: {ex.section!r}"


def test_known_errors_point_to_headings():
    for _, _, section in KNOWN_ERRORS:
        assert not sections_exist(section, "01"), section


def test_untouched_stubs_say_not_attempted(py):
    output = run_sources(section(py))
    lines = check_lines(output)
    assert lines and all("○ not attempted yet" in line for line in lines.values()), output
    assert not re.search(r"^\w+(Error|Exception)\b", output, re.M), output


def test_stored_outputs_say_not_attempted(py):
    nb = nbformat.read(notebook_path(py), as_version=4)
    texts = [
        "".join(o.get("text", "") for o in c.outputs)
        for c in exercise_cells(nb, py.name)
        if c.cell_type == "code" and check_number(c.source) is not None
    ]
    assert texts and all("not attempted yet" in t for t in texts), texts


@needs_solutions
def test_reference_solutions_are_correct(py):
    found = solutions(py.stem)
    for choice in range(max(len(e["solution"]) for e in found.values())):
        chosen = {n: e["solution"][min(choice, len(e["solution"]) - 1)] for n, e in found.items()}
        output = run_sources(replaced(section(py), chosen))
        lines = check_lines(output)
        assert sorted(lines) == sorted(found), output
        wrong = {n: line for n, line in lines.items() if "✓ correct" not in line}
        assert not wrong, f"{py.name}, solution variant {choice}:\n{output}"


@needs_solutions
def test_known_wrong_answers_get_their_hint(py):
    for number, entry in solutions(py.stem).items():
        for code, expected in entry["wrong"]:
            output = run_sources(replaced(section(py), {number: code}))
            line = check_lines(output).get(number, "")
            capitalised = expected[:1].upper() + expected[1:]  # a hint's first letter is printed upper-case
            assert "✗ not yet" in line and (expected in line or capitalised in line) and "Re-read" in line, (
                f"{py.name} exercise {number}: expected a hint containing {expected!r}, got:\n{output}"
            )
            assert "Traceback" not in output
            reread = re.search(r"Re-read “(.*)”\.$", line).group(1)
            assert not sections_exist(reread, py.stem[:2]), f"{py.name} exercise {number}: no heading {reread!r}"


# The mechanism itself, on a toy registry.
TOY = Registry("toy")


@TOY.exercise(1, "double", "section A")
def _double(fn):
    value = fn(2)
    if value == 2:
        hint("you returned the input", "section B")
    assert value == 4


def test_judge_reports_every_status_without_a_traceback():
    assert judge(TOY, 1, ...)[0] == NOT_ATTEMPTED

    stub = _cell_function('def stub(x):\n    raise NotImplementedError("your code here")\n', "stub")
    assert judge(TOY, 1, stub)[0] == NOT_ATTEMPTED
    assert judge(TOY, 1, lambda x: 2 * x) == (CORRECT, "")
    status, message = judge(TOY, 1, lambda x: x)
    assert status == WRONG and message == "You returned the input. Re-read “section B”."

    cell = {}  # a learner's function, defined in a notebook cell
    exec(
        compile(
            "def broken(x):\n    raise RuntimeError(\"view size is not compatible with input tensor's size "
            'and stride (at least one ...)")\n',
            "<cell>",
            "exec",
        ),
        cell,
    )
    status, message = judge(TOY, 1, cell["broken"])
    assert status == WRONG and "Your code raised RuntimeError in `broken` (line 2 of its cell)" in message
    assert "use `reshape`" in message and "01 · 4. Memory layout" in message


def test_a_check_never_grades_an_older_answer_and_a_check_before_its_stub_says_so():
    """make progress as JupyterLab (utils.exercises._watch_cells): a stub whose last run raised is not graded from
    the answer an earlier run left, and a check run before its stub gets one line, not a NameError."""
    sources = section(SOURCES[0])
    right = solutions(SOURCES[0].stem)[1]["solution"][0] if SOLUTIONS_DIR.is_dir() else None
    if right is None:
        pytest.skip("no solutions/")
    stub = next(s for s in sources if stub_number(s) == 1)
    check = next(s for s in sources if check_number(s) == 1)
    setup = sources[0]
    broken = stub.splitlines()[0] + "\n" + right.rstrip()[:-1]  # the right answer with its last bracket lost
    output = run_sources([setup, check, stub.splitlines()[0] + "\n" + right, check, broken, check])
    lines = [ln for ln in output.splitlines() if ln.startswith("Exercise 1")]
    assert lines[0].startswith("Exercise 1 (练习 1): ○ not attempted yet. `answer_1` is not defined: run the")
    assert lines[1] == "Exercise 1 (练习 1): ✓ correct."
    assert lines[2].startswith("Exercise 1 (练习 1): ✗ not yet. The exercise's cell above raised SyntaxError")


@TOY.exercise(3, "returns something", "section A")
def _returns_something(fn):
    returns(fn)


def test_a_hint_that_asks_a_question_keeps_its_question_mark():
    status, message = judge(TOY, 3, lambda: None)
    assert message.startswith("Your function returned None: did you forget `return`? Re-read “"), message


def test_a_broken_stub_cell_is_reported_and_the_others_still_run():
    sources = section(SOURCES[0])
    broken = {1: "answer_1 = [(2, 4), (2, 1, 4)"}  # a syntax error
    output = run_sources(replaced(sources, broken))
    lines = check_lines(output)
    assert "✗ not yet. The exercise's cell above raised SyntaxError on its last run" in lines[1]
    assert all("not attempted" in lines[n] for n in lines if n != 1)


@needs_solutions
def test_progress_reads_the_saved_notebooks(tmp_path):
    py = SOURCES[0]
    nb = read_notebook(notebook_path(py))
    for cell in exercise_cells(nb, py.name):
        if stub_number(cell.source) == 1:
            cell.source = solutions(py.stem)[1]["solution"][0]
    jupytext.write(nb, tmp_path / py.with_suffix(".ipynb").name)
    table = progress(folder=tmp_path)
    assert re.search(rf"^{py.stem}\s+1✓  2○  3○$", table, re.M), table
    assert table.rstrip().endswith("1 of 3 exercises correct.")


@TOY.exercise(2, "draws random numbers", "section A")
def _draws(value):
    import torch

    torch.manual_seed(123)  # a check may seed and draw as it likes ...
    torch.rand(3)
    assert value == 1 + "x"  # ... and a bug in a check, or an answer it cannot use, is not blamed on the learner


def test_a_check_leaves_the_learners_random_state_alone_and_owns_its_errors():
    import torch

    torch.manual_seed(0)
    expected = torch.rand(2)
    torch.manual_seed(0)
    status, message = judge(TOY, 2, 1)
    assert status == WRONG and message.startswith("The check could not use your answer (TypeError: unsupported")
    assert torch.equal(torch.rand(2), expected)  # as if the check had never run


def test_the_manifest_names_every_exercise_as_the_checks_do(py):
    """course.toml's exercises (which make the solutions index and the website) are the registered ones."""
    registered = Checker(py.stem[:2], quiet=True).registry.exercises
    listed = lesson(py.stem).exercises
    assert [e.number for e in listed] == sorted(registered), f"course.toml, lesson {py.stem[:2]}: exercises"
    for e in listed:
        title = re.sub(r" \((predict|write a \w+|stretch)\)$", "", registered[e.number].title)
        assert e.title == title, f"course.toml, lesson {py.stem[:2]}, exercise {e.number}: {e.title!r} != {title!r}"


def _cell_function(source: str, name: str):
    """A function defined in a notebook cell (its file name is the cell's, as in IPython)."""
    cell: dict = {}
    exec(compile(source, "<cell>", "exec"), cell)
    return cell[name]


def test_an_attempted_answer_that_raises_not_implemented_is_not_yet_not_unattempted():
    """E8: only the stub's own `raise NotImplementedError` means "not attempted"; nn.Module's for a misspelt
    forward, or an operator's for a tensor it does not support, is the answer's error."""
    import torch
    from torch import nn

    class Misspelt(nn.Module):
        def foward(self, x):
            return x

    status, message = judge(TOY, 1, lambda x: Misspelt()(torch.ones(1)))
    assert status == WRONG and 'missing the required "forward" function' in message, message


def test_an_answer_that_exits_gets_one_line():
    """E3a: sys.exit() in an answer is reported like any other error, never a raw SystemExit."""
    import sys

    status, message = judge(TOY, 1, lambda x: sys.exit("done"))
    assert status == WRONG and "SystemExit" in message and "done" in message, message


def test_a_check_runs_with_gradients_on_whatever_the_learner_set():
    """E4: an earlier `torch.set_grad_enabled(False)` does not fail a right answer, and stays the learner's."""
    import torch

    py = SOURCES[1]  # 02 autograd
    if not SOLUTIONS_DIR.is_dir():
        pytest.skip("no solutions/")
    chosen = {n: e["solution"][0] for n, e in solutions(py.stem).items()}
    output = run_sources(["import torch\ntorch.set_grad_enabled(False)", *replaced(section(py), chosen)])
    assert all("✓ correct" in line for line in check_lines(output).values()), output
    torch.set_grad_enabled(True)


@TOY.exercise(4, "a number", "section A")
def _a_number(value):
    from utils.exercises import number_answer

    number_answer(value, "RANK")


def test_a_huge_wrong_answer_gives_a_short_hint():
    """E2: a hint quoting the answer stays short."""
    status, message = judge(TOY, 4, list(range(1_000_000)))
    assert status == WRONG and len(message) < 800 and message.startswith("RANK should be a number"), message[:300]


def test_wrong_exercise_numbers_and_notebooks_get_one_line(capsys):
    """E6: an unknown exercise, a missing answer or a wrong notebook number is one clear line, no traceback."""
    ex = Checker(1, quiet=True)  # an int is read as "01"
    assert ex.notebook == "01"
    ex.check(7, 1)
    assert capsys.readouterr().out.startswith("There is no exercise 7 in notebook 01: its exercises are 1, 2, 3")
    ex.check(2)
    assert "takes 1 answer(s) after the exercise number, got 0" in capsys.readouterr().out
    with pytest.raises(ValueError, match="this course has no exercises for a notebook 13"):
        Checker("13")


def test_an_emptied_registry_is_rebuilt_by_a_new_checker():
    """E5a: `ex.registry.exercises.clear()` in a cell; a new Checker recovers without a kernel restart."""
    ex = Checker("01", quiet=True)
    saved = dict(ex.registry.exercises)
    ex.registry.exercises.clear()
    try:
        assert sorted(Checker("01", quiet=True).registry.exercises) == sorted(saved)
    finally:
        import utils.exercises.nb01 as nb01

        nb01.EXERCISES.exercises.update(saved)  # the tests' modules see the same registry again


def _saved_with(tmp_path, replacements: dict[int, str]) -> Path:
    py = SOURCES[0]
    nb = read_notebook(notebook_path(py))
    for cell in exercise_cells(nb, py.name):
        if (n := stub_number(cell.source)) in replacements:
            cell.source = replacements[n]
    jupytext.write(nb, tmp_path / py.with_suffix(".ipynb").name)
    return tmp_path


@needs_solutions
@pytest.mark.parametrize(
    "stub_2",
    [
        "# ✏️ Exercise 2\nimport sys\nsys.exit()",
        "# ✏️ Exercise 2\nraise SystemExit(0)",
        "# ✏️ Exercise 2\nimport torch\nex = torch.randn(3)  # an example tensor",
        "# ✏️ Exercise 2\ndel ex",
    ],
    ids=["sys.exit", "SystemExit", "ex rebound", "ex deleted"],
)
def test_progress_never_drops_an_exercise(tmp_path, stub_2):
    """E3b, E5b: a stub that exits or replaces `ex` leaves every exercise in the table, the others still checked."""
    right_3 = solutions(SOURCES[0].stem)[3]["solution"][0]
    table = progress(folder=_saved_with(tmp_path, {2: stub_2, 3: right_3}))
    row = re.search(rf"^{SOURCES[0].stem}\s+(.*)$", table, re.M).group(1)
    assert row.split()[0] == "1○" and row.split()[1] in ("2✗", "2?") and row.split()[2] in ("3✓", "3?"), table
    assert "of 3 exercises correct." in table, table
    if "3?" in row:  # `ex` gone: the check cell of exercise 3 raised, and the table says why
        assert re.search(r"exercise 3: its check cell raised \w+Error: .*`ex` was replaced or deleted", table), table


@needs_solutions
def test_progress_names_a_damaged_notebook_in_one_line(tmp_path):
    """E7: a half-saved notebook is one line that names the fix; the table goes on."""
    folder = _saved_with(tmp_path, {})
    path = folder / SOURCES[0].with_suffix(".ipynb").name
    path.write_text(path.read_text(encoding="utf-8")[:5000], encoding="utf-8")
    table = progress(folder=folder)
    assert re.search(rf"^{SOURCES[0].stem}\s+cannot be read \(.*git checkout -- notebooks/", table, re.M), table


@needs_solutions
def test_progress_keeps_what_ran_before_an_endless_check(tmp_path):
    """E1b: a stub that never ends costs its notebook the timeout, not the results of the exercises before it."""
    right_1 = solutions(SOURCES[0].stem)[1]["solution"][0]
    table = progress(folder=_saved_with(tmp_path, {1: right_1, 2: "# ✏️ Exercise 2\nwhile True:\n    pass"}), timeout=25)
    assert re.search(rf"^{SOURCES[0].stem}\s+1✓  2\?  3\?$", table, re.M), table
    assert "exercise 2, 3 not checked: its exercises ran longer than 25 s" in table, table
