"""The notebooks' stored outputs are trustworthy, and the harness is configured as README says."""

import configparser
import contextlib
import os
import re
import shutil
import subprocess

import nbformat
import pytest
import torch

from tools.notebooks import (
    ERRATA_HEADING,
    NOTEBOOK_ENV,
    PINNED_X86_NUMERICS,
    PORTABLE_CONFIGS,
    _warning_lines,
    apply_test_env,
    check,
    dangling_references,
    execute,
    learner_env,
    notebook_env,
    notebook_path,
    read_source,
    section_numbers,
    source_digest,
    sync,
)
from tools.syllabus import shown_seconds
from utils import REPO_ROOT
from utils.syllabus import Lesson, lessons

NOTEBOOKS = [x.notebook for x in lessons()]
SOURCES = [x.source for x in lessons()]
SOURCE_06 = next(p for p in SOURCES if p.name.startswith("06_"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 12, "course.toml lists fewer lessons than the course has"


@pytest.mark.parametrize("py", SOURCES, ids=lambda p: p.name)
def test_every_source_has_an_executed_notebook(py):
    assert notebook_path(py).exists(), f"{py.name} was never executed: run `make execute NB={py.stem}`"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_in_sync_and_cleanly_executed(nb):
    lesson = next(x for x in lessons() if x.notebook == nb)
    sections = {x.nn: section_numbers(read_source(x.source)) for x in lessons()}
    assert check(nb, lesson, sections) == []


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_metadata_is_minimal(nb):
    node = nbformat.read(nb, as_version=4)
    assert set(node.metadata) == {"kernelspec", "language_info", "torch_course"}
    assert all(cell.metadata in ({}, {"tags": ["shared"]}) for cell in node.cells)


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_opens_and_closes_for_a_learner(nb):
    cells = nbformat.read(nb, as_version=4).cells
    assert cells[0].cell_type == "markdown" and cells[0].source.startswith("# "), "first cell: a title"
    assert re.search(r"\*\*Study time:\*\* about \d+ min", cells[0].source), "first cell: how long it takes"
    last = cells[-1].source if cells[-1].cell_type == "markdown" else ""
    assert "summary" in last.lower() or last.startswith(ERRATA_HEADING), "last: a summary, or the notes' errata"


DEMO_HEADER = "# %% [markdown]\n# # 99 · Demo (演示)\n# **Study time:** about 5 min.\n\n"
DEMO_SUMMARY = "\n# %% [markdown]\n# ## Summary\n# Done.\n"
DEMO = Lesson(99, "demo", "Demo", "演示", "demo", 5, "nothing", "nothing", ())


def _demo(tmp_path, code="print(1)"):
    """A one-cell demo notebook as make execute stores it (4.2 s measured)."""
    (tmp_path / "src").mkdir()
    src = tmp_path / "src" / "99_demo.py"
    src.write_text(DEMO_HEADER + f"# %%\n{code}\n" + DEMO_SUMMARY)
    nb = read_source(src)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    nb.cells[1].execution_count = 1
    nb.metadata = {"torch_course": {"source_sha256": source_digest(nb), "run_seconds": 4.2}}
    nbformat.write(nb, tmp_path / "99_demo.ipynb")
    return src, nb


def test_check_catches_a_stale_notebook(tmp_path):
    src, nb = _demo(tmp_path)
    assert check(tmp_path / "99_demo.ipynb", DEMO) == []
    src.write_text(DEMO_HEADER + "# %%\nprint(2)\n")  # source edited, not re-executed
    problems = check(tmp_path / "99_demo.ipynb")
    assert any("not made from the code of 99_demo.py: run `make execute NB=99`" in p for p in problems)
    nb.cells[1].source = "print(2)"  # notebook edited by hand, outputs kept
    nbformat.write(nb, tmp_path / "99_demo.ipynb")
    assert any("not made from these cells" in p for p in check(tmp_path / "99_demo.ipynb"))


def test_a_prose_edit_costs_no_run(tmp_path):
    """Edit a Markdown line of a source, sync: the check passes, the notebook shows the new text, outputs untouched."""
    src, nb = _demo(tmp_path)
    src.write_text(src.read_text().replace("about 5 min.", "about 5 min. A new sentence."))
    assert any("differ in their Markdown: run `make sync`" in p for p in check(tmp_path / "99_demo.ipynb", DEMO))
    assert sync(src) is True
    synced = nbformat.read(tmp_path / "99_demo.ipynb", as_version=4)
    assert "A new sentence." in synced.cells[0].source
    assert synced.cells[1].outputs == nb.cells[1].outputs and synced.cells[1].execution_count == 1
    assert synced.metadata == nb.metadata  # the digest and the measured run time: nothing was run
    assert check(tmp_path / "99_demo.ipynb", DEMO) == []
    assert sync(src) is False  # nothing left to copy
    # JupyterLab's jupytext opens the pair: the source is the newer file (else it compares the two and refuses)
    assert src.stat().st_mtime >= (tmp_path / "99_demo.ipynb").stat().st_mtime


def test_sync_refuses_changed_code_and_names_the_cell(tmp_path):
    src, _ = _demo(tmp_path)
    src.write_text(DEMO_HEADER + "# %%\nprint(2)\n")
    with pytest.raises(ValueError, match=r"code cell 1 changed \('print\(2\)'\): run `make execute NB=99`"):
        sync(src)
    src.write_text(DEMO_HEADER + "# %%\nprint(1)\n\n# %%\nprint(3)\n" + DEMO_SUMMARY)
    with pytest.raises(ValueError, match="2 code cells, the notebook 1"):
        sync(src)


def test_check_compares_the_first_cell_with_the_manifest(tmp_path):
    _demo(tmp_path)
    other = Lesson(99, "demo", "Other title", "演示", "demo", 50, "x", "x", ())
    text = "\n".join(check(tmp_path / "99_demo.ipynb", other))
    assert "course.toml makes it '# 99 · Other title (演示)'" in text
    assert "'**Study time:** about 50 min' once, as course.toml does (it says 5)" in text


def test_section_references_must_name_a_heading():
    sections = {"01": {"1", "2", "2.1"}, "04": {"3", "5", "13"}}
    text = (
        "See section 2 and §2.1, sections 1 and 2, and [notebook 04](04_mnist_cnn.ipynb), §3–5, notebook 04's "
        "section 13 (which uses §1 here? no: the same sentence points into 04). Hooks (notebook 04) help in "
        "section 1. Section 9 is missing. Notebook 07, section 1."
    )
    assert dangling_references(text, "01", sections) == [
        "notebook 04 §1",
        "§9",
        "notebook 07 (no such lesson) §1",
    ]


def test_shown_run_times():
    assert [shown_seconds(s) for s in (0.4, 7.4, 7.6, 98, 104, 236)] == [5, 5, 10, 100, 100, 240]


def test_execute_writes_the_measured_run_time_into_the_metadata(tmp_path):
    src, _ = _demo(tmp_path, code="import time\ntime.sleep(3)\nprint(1)")
    before = src.read_text()
    path, seconds = execute(src)
    assert seconds >= 3
    stored = nbformat.read(path, as_version=4)
    assert stored.metadata["torch_course"]["run_seconds"] == round(seconds, 1)
    assert src.read_text() == before  # the source is not touched: the time lives in the metadata only
    assert stored.cells[1].outputs[0]["text"] == "1\n"
    assert check(path, DEMO) == []


def test_check_catches_errors_warnings_and_unasserted_ignores(tmp_path):
    (tmp_path / "src").mkdir()
    src = tmp_path / "src" / "98_demo.py"
    src.write_text("# %%\n# NBVAL_IGNORE_OUTPUT\nprint(1)\n\n# %%\nx = 1\n\n# %%\ny = 2\n")
    nb = read_source(src)
    nb.cells[0].execution_count, nb.cells[1].execution_count, nb.cells[2].execution_count = 1, 3, 4
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stderr", text="FutureWarning: old\n")]
    nb.cells[1].outputs = [nbformat.v4.new_output("error", ename="ValueError", evalue="x", traceback=[])]
    nb.metadata = {"torch_course": {"source_sha256": source_digest(nb)}}
    nbformat.write(nb, tmp_path / "98_demo.ipynb")
    text = "\n".join(check(tmp_path / "98_demo.ipynb"))
    expected_problems = (
        "not 1..3",
        "stored error output",
        "FutureWarning",
        "without an assert",
        "max 20%",
        "asserts nothing",
    )
    for expected in expected_problems:
        assert expected in text


def test_same_environment_for_execute_and_test():
    assert NOTEBOOK_ENV["OMP_NUM_THREADS"] == "1"
    assert NOTEBOOK_ENV["TORCH_COURSE_DEVICE"] == "cpu"
    assert "error::DeprecationWarning" in NOTEBOOK_ENV["PYTHONWARNINGS"]
    assert "error::FutureWarning" in NOTEBOOK_ENV["PYTHONWARNINGS"]
    assert "TORCH_COURSE_DEVICE" not in notebook_env(gpu=True)


def test_sanitize_file_has_no_empty_replacement():
    cfg = configparser.ConfigParser()
    cfg.read(REPO_ROOT / "tests" / "sanitize.cfg")
    assert cfg.sections()
    for section in cfg.sections():
        assert cfg[section].get("regex") and cfg[section].get("replace"), section
        re.compile(cfg[section]["regex"])


MAKE_COMMAND = re.compile(r"(?:`|^)(?:[A-Z_]+=\S+ )*make ([a-z][\w-]*)", re.M)
"""``make X`` as the course writes it for a reader: in backticks or at the start of a line, maybe after VAR=value."""


def _make_commands_mentioned() -> dict[str, set[str]]:
    """``{target: files}`` for every ``make`` command in the docs, CI and the messages of the course's code."""
    code = [p for folder in ("utils", "tools", "notebooks", "benchmarks") for p in (REPO_ROOT / folder).rglob("*.py")]
    places = [*REPO_ROOT.glob("*.md"), REPO_ROOT / ".ci" / "run", *REPO_ROOT.glob("*/*.md"), *code]
    found: dict[str, set[str]] = {}
    for path in places:
        for target in MAKE_COMMAND.findall(path.read_text(encoding="utf-8")):
            found.setdefault(target, set()).add(path.relative_to(REPO_ROOT).as_posix())
    return found


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_every_make_command_the_course_mentions_is_a_target():
    """What README, .ci/run, solutions/ and error messages tell a reader to run does something.

    ``make -n`` prints the commands without running them; a name listed in .PHONY but without a rule
    passes ``make -n`` too, so its output must not be "Nothing to be done".
    """
    mentioned = _make_commands_mentioned()
    assert {"lab", "test", "execute"} <= set(mentioned)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # not make test's
    for target, files in sorted(mentioned.items()):
        dry = subprocess.run(
            ["make", "-n", target],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            env={**env, "LC_ALL": "C"},
            timeout=60,
        )
        assert dry.returncode == 0 and "Nothing to be done" not in dry.stdout, (
            f"{sorted(files)} mention `make {target}`: {dry.stderr.strip() or dry.stdout.strip()}"
        )


def test_x86_numerics_are_pinned(monkeypatch):
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    env = notebook_env()
    assert {k: env[k] for k in PINNED_X86_NUMERICS} == {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_CBWR": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "TORCHINDUCTOR_CPP_MARCH": "x86-64-v3",
    }
    assert "MKL_CBWR" not in notebook_env(numerics="two-threads")  # unpinned, as on a learner's machine
    monkeypatch.setattr("platform.machine", lambda: "arm64")
    assert not set(PINNED_X86_NUMERICS) & set(notebook_env())  # meaningless on ARM: not set


def test_every_portable_configuration_changes_the_numerics(monkeypatch):
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    native = notebook_env()
    assert len(PORTABLE_CONFIGS) >= 2
    for name in PORTABLE_CONFIGS:
        env = notebook_env(numerics=name)
        changed = {k for k in env if env[k] != native.get(k)}
        assert changed & {"ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS"}, name
        assert env["TORCH_COURSE_DEVICE"] == "cpu" and env["PYTHONWARNINGS"] == NOTEBOOK_ENV["PYTHONWARNINGS"]
    with pytest.raises(ValueError, match="TORCH_COURSE_NUMERICS='avx512' is not one of narrow-isa"):
        notebook_env(numerics="avx512")


def test_learner_env_pins_nothing(monkeypatch):
    for key, value in notebook_env(numerics="two-threads").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TORCH_COURSE_NUMERICS", "two-threads")
    env = learner_env()
    assert env["PYTHONWARNINGS"] == "default"  # every warning shown once per place
    for key in (
        "OMP_NUM_THREADS",
        "TORCH_COURSE_DEVICE",
        "CUDA_VISIBLE_DEVICES",
        "MKL_CBWR",
        "ATEN_CPU_CAPABILITY",
        "TORCH_COURSE_NUMERICS",
    ):
        assert key not in env, key


def test_warning_lines_are_found_in_text_and_stderr():
    cell = nbformat.v4.new_code_cell("x = 1")
    cell.outputs = [
        nbformat.v4.new_output(
            "stream", name="stderr", text="/x/y.py:3: ResourceWarning: unclosed file <x>\n  f = open()\n"
        ),
        nbformat.v4.new_output("stream", name="stdout", text="TracerWarning: Converting a tensor\nno warning here\n"),
    ]
    assert _warning_lines(cell) == {"ResourceWarning: unclosed file <x>", "TracerWarning: Converting a tensor"}
    again = nbformat.v4.new_code_cell("x = 1")
    again.outputs = [
        nbformat.v4.new_output(
            "stream", name="stderr", text="/tmp/ipykernel_9/8.py:3: ResourceWarning: unclosed file <x>\n"
        )
    ]
    assert _warning_lines(again) <= _warning_lines(cell)  # the same warning from another run and place


@contextlib.contextmanager
def _environ_restored():
    """apply_test_env writes os.environ itself, out of monkeypatch's sight: put it back afterwards."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.parametrize(
    ("variables", "expected", "absent"),
    [
        ({}, {"OMP_NUM_THREADS": "1", "TORCH_COURSE_DEVICE": "cpu"}, set()),
        ({"TORCH_COURSE_NUMERICS": "two-threads"}, {"OMP_NUM_THREADS": "2"}, {"MKL_CBWR", "ONEDNN_MAX_CPU_ISA"}),
        ({"TORCH_COURSE_GPU": "1"}, {"OMP_NUM_THREADS": "1"}, {"TORCH_COURSE_DEVICE", "CUDA_VISIBLE_DEVICES"}),
    ],
)
def test_test_targets_get_their_environment(monkeypatch, variables, expected, absent):
    """What conftest.py applies: the notebook kernels of make test, test-portable and test-lax inherit it."""
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    with _environ_restored():
        for key in (
            "TORCH_COURSE_NUMERICS",
            "TORCH_COURSE_GPU",
            "TORCH_COURSE_DEVICE",
            "CUDA_VISIBLE_DEVICES",
            *PINNED_X86_NUMERICS,
        ):
            os.environ.pop(key, None)
        os.environ.update(variables)
        os.environ["MKL_CBWR"] = "left over"  # a pinned variable the configuration may remove
        apply_test_env()
        assert {k: os.environ.get(k) for k in expected} == expected
        assert not absent & set(os.environ)


def test_this_session_runs_as_conftest_promises():
    """The nbval kernels inherit this process's environment: applying it again must change nothing.
    The unit tests run on one thread (two test workers share two cores)."""
    with _environ_restored():
        before = dict(os.environ)
        apply_test_env()
        changed = {k: (before.get(k), v) for k, v in os.environ.items() if before.get(k) != v}
    assert changed == {}, "conftest.py did not apply apply_test_env(): (now, expected)"
    assert torch.get_num_threads() == 1


def test_the_notes_are_named_at_most_twice_above_the_closing_section(tmp_path):
    src, _ = _demo(tmp_path)
    body = src.read_text()
    lines = "# The notes say x. The notes say y.\n"
    tail = "\n# %% [markdown]\n" + "\n".join(
        "# " + line for line in [ERRATA_HEADING, "", "| what the notes say | now | where |"]
    )
    src.write_text(body.replace("# **Study time:** about 5 min.\n", "# **Study time:** about 5 min.\n" + lines) + tail)
    sync(src)
    assert check(tmp_path / "99_demo.ipynb", DEMO) == []  # twice above; the table below does not count
    src.write_text(src.read_text().replace("# Done.", "# Done, as the notes say."))
    sync(src)
    assert any("says 'the notes' 3 times above its closing section" in p for p in check(tmp_path / "99_demo.ipynb"))


@pytest.mark.parametrize("py", SOURCES, ids=lambda p: p.name)
def test_every_lesson_ends_with_its_errata_for_readers_of_the_notes(py):
    """Each lesson teaches in its own voice; what the old notes got wrong is one closing table, after the summary
    (where and how often "the notes" may appear above it, make check says)."""
    nb = read_source(py)
    headings = [c.source.splitlines()[0] for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## ")]
    assert headings[-1] == ERRATA_HEADING, f"{py.name}: the last section should be {ERRATA_HEADING!r}"
    assert "| " in nb.cells[-1].source or any("| " in c.source for c in nb.cells[-3:]), "the errata are a table"


def test_n4_lessons_use_no_pytest_and_06_names_the_cell_to_run():
    """Probe N4: notebook 06 wrapped `torch.load(whole_path)` in `pytest.warns`, which turned the NameError of a skipped
    cell into `Failed: DID NOT WARN`. Lessons show errors with plain try/except; a cell that builds on an earlier one
    calls `needs(...)`, which names the cell to run."""
    for x in lessons():
        text = x.source.read_text(encoding="utf-8")
        assert not re.search(r"^\s*(import|from) pytest\b|\bpytest\.", text, re.M), f"{x.source.name} uses pytest"
    cells = [c.source for c in read_source(SOURCE_06).cells if c.cell_type == "code"]
    users = [c for c in cells if "torch.load(whole_path" in c and "whole_path =" not in c]
    assert users and all(re.search(r'needs\("whole_path"', c) for c in users)


def test_r4_a_half_saved_notebook_is_named_in_one_line(tmp_path, monkeypatch):
    """Probe R4: `make check` on a truncated notebook named it with how to get it back, and no `make sync` line
    (the start page is stale only because that notebook's run time cannot be read)."""
    import tools.notebooks as tn

    x = next(x for x in lessons() if x.nn == "03")
    (tmp_path / "src").mkdir()
    shutil.copy(x.source, tmp_path / "src" / x.source.name)
    half = tmp_path / x.notebook.name
    half.write_bytes(x.notebook.read_bytes()[:5000])
    [line] = check(half)
    assert line.startswith(f"{x.notebook.name} cannot be read (NotJSONError: ") and "\n" not in line
    assert f"git checkout -- notebooks/{x.notebook.name}" in line and "make execute NB=03" in line
    monkeypatch.setattr(tn, "check", lambda path, *a: [line] if path == x.notebook else [])
    monkeypatch.setattr(tn, "stale", lambda: [REPO_ROOT / "notebooks" / "00_start_here.md"])
    assert tn.check_all() == [line]


def test_r3_a_source_missing_from_course_toml_is_named_and_nothing_runs(tmp_path, monkeypatch):
    """Probe R3: `make execute` of a new source that course.toml does not list says so truthfully, writing nothing."""
    import tools.notebooks as tn

    (tmp_path / "99_probe.py").write_text("# %%\nprint(1)\n")
    monkeypatch.setattr(tn, "SOURCES_DIR", tmp_path)
    monkeypatch.setattr(tn, "REPO_ROOT", tmp_path.parent)
    with pytest.raises(SystemExit, match=r"99_probe\.py is not a lesson of course\.toml yet: add a \[\[lessons\]\]"):
        tn.main(["execute", "99"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["99_probe.py"]
