"""JupyterLab as a learner meets it, and a learner's path through an exercise, in a real browser.

Starts JupyterLab as ``make lab`` does (``python -m tools.lab``, on a copy of ``notebooks/``, on
127.0.0.1), drives Debian's Chromium headless with Playwright (``/usr/bin/chromium``; Playwright never
downloads a browser here). First what a learner sees on the first start: the start page, and a file
browser that lists it and the lessons, nothing else. Then notebook 01: runs its exercise setup cell,
types a wrong answer into exercise 1 and reads the hint on the page, then types the right answer, reads
the success and saves, which must also update the notebook's jupytext source. Screenshots go to
``runs/test-browser/``.

Not part of ``make test``: it needs Chromium (``make test-browser`` installs it when missing).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tools.notebooks import learner_env
from tools.syllabus import START_PAGE
from utils.exercises import WRONG as NOT_YET
from utils.exercises import Checker, judge
from utils.paths import NOTEBOOKS_DIR, REPO_ROOT
from utils.syllabus import lessons

CHROMIUM = os.environ.get("TORCH_COURSE_CHROMIUM", "/usr/bin/chromium")
NOTEBOOK = "01_tensors.ipynb"
LESSONS = [x.ipynb for x in lessons()]
OUT = REPO_ROOT / "runs" / "test-browser"
TOKEN = "torch-course-browser-test"
WRONG = "answer_1 = [(2, 1, 4), (2, 4), (1, 4, 12)]"  # a and b swapped: keepdim misread
RIGHT = "answer_1 = [(2, 4), (2, 1, 4), (1, 4, 12)]"

playwright = pytest.importorskip(
    "playwright.sync_api", reason="make test-browser installs it (requirements-browser.txt)"
)


def _hint_for(source: str) -> str:
    """What the check says about this stub (the same checker, run here): the page must show it."""
    namespace: dict = {}
    exec(source, namespace)
    status, message = judge(Checker("01", quiet=True).registry, 1, namespace["answer_1"])
    assert status == NOT_YET and "swapped" in message, message
    return message


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab started as `make lab` does, on a copy of notebooks/, with its own user config and settings."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} not found: run `make test-browser`, which installs Debian's chromium")
    root = tmp_path_factory.mktemp("lab")
    work = root / "notebooks"  # a copy: the learner's edits must not touch the repo
    shutil.copytree(NOTEBOOKS_DIR, work, ignore=shutil.ignore_patterns("runs", ".ipynb_checkpoints"))
    port = _free_port()
    # A learner's environment, not the test session's: with its DeprecationWarnings as errors, JupyterLab
    # would start without its jupytext extension (whose loader warns), and saving would not pair.
    env = dict(
        learner_env(),
        JUPYTER_CONFIG_DIR=str(root / "config"),
        JUPYTERLAB_SETTINGS_DIR=str(root / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(root / "workspaces"),
        JUPYTER_RUNTIME_DIR=str(root / "runtime"),
        TORCH_COURSE_DEVICE="cpu",
    )
    log = open(root / "lab.log", "w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tools.lab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--folder={work}",
            f"--IdentityProvider.token={TOKEN}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start; its log:\n{(root / 'lab.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield base, work
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def _cell(page, text: str):
    return page.locator(".jp-Notebook .jp-CodeCell").filter(has_text=text).first


def _type_into(page, cell, source: str) -> None:
    """Click into a cell's editor, select everything and type the new source, as a learner does."""
    editor = cell.locator(".cm-content")
    editor.click()
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.press("Backspace")
    page.keyboard.type(source)


def _run(page, cell, timeout_s: float = 120) -> str:
    """Shift+Enter in the cell, wait until the kernel has run it, return its output text.

    The notebook opens with its stored outputs (as a learner sees it), so the run is known to be
    over when the execution count in the cell's prompt has changed, not when some output is there.
    """
    prompt = cell.locator(".jp-InputPrompt")
    before = prompt.text_content()
    cell.locator(".cm-content").click()
    page.keyboard.press("Shift+Enter")
    deadline = time.monotonic() + timeout_s
    while (now := prompt.text_content()) in (before, "[*]:") or "*" in now:
        if time.monotonic() > deadline:
            raise AssertionError(f"the cell did not finish in {timeout_s} s (prompt {now!r})")
        time.sleep(0.2)
    return cell.locator(".jp-OutputArea").text_content()


@pytest.fixture
def page(lab):
    """A fresh Chromium page, 1280 x 900, that waits up to 60 s for what it looks for."""
    OUT.mkdir(parents=True, exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(60_000)
            yield page
        finally:
            browser.close()


def test_the_first_start_shows_the_start_page_and_only_the_lessons(lab, page):
    base, _ = lab
    page.goto(f"{base}/?token={TOKEN}")  # the address `make lab` opens in the learner's browser
    start = page.locator(".jp-RenderedMarkdown").filter(has_text="Start here")
    start.locator("a", has_text="tensors").wait_for()  # rendered Markdown, with links to the lessons
    listed = page.locator(".jp-DirListing-content .jp-DirListing-itemText")
    listed.first.wait_for()
    page.screenshot(path=str(OUT / "first-start.png"))
    tab = page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel")
    assert tab.text_content() == START_PAGE.name
    assert sorted(listed.all_text_contents()) == [START_PAGE.name, *LESSONS]


def test_a_learner_gets_a_hint_then_a_success(lab, page):
    base, work = lab
    page.goto(f"{base}/lab/tree/{NOTEBOOK}?token={TOKEN}")
    page.locator(".jp-Notebook").wait_for()
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=120_000)

    setup = _cell(page, 'ex = Checker("01")')
    assert "Notebook 01: 3 exercises" in _run(page, setup)

    stub, check = _cell(page, "# ✏️ Exercise 1"), _cell(page, "ex.check(1, answer_1)")
    _run(page, stub)
    assert "○ not attempted yet" in _run(page, check)  # the stub as shipped

    _type_into(page, stub, "# ✏️ Exercise 1: my answer\n" + WRONG)
    _run(page, stub)
    text = _run(page, check)
    assert "✗ not yet" in text and _hint_for(WRONG) in text and "Re-read" in text, text
    assert "Traceback" not in text
    check.scroll_into_view_if_needed()
    page.screenshot(path=str(OUT / "exercise-hint.png"))

    _type_into(page, stub, "# ✏️ Exercise 1: my answer\n" + RIGHT)
    _run(page, stub)
    text = _run(page, check)
    assert "Exercise 1 (练习 1): ✓ correct" in text, text
    page.screenshot(path=str(OUT / "exercise-correct.png"))
    assert page.get_by_text("official Jupyter news").count() == 0, "JupyterLab asked about news"
    page.keyboard.press("ControlOrMeta+s")  # saved: the jupytext source is rewritten too
    source = work / "src" / NOTEBOOK.replace(".ipynb", ".py")
    deadline = time.monotonic() + 30
    while RIGHT not in source.read_text():
        assert time.monotonic() < deadline, f"saving {NOTEBOOK} did not update src/{source.name}"
        time.sleep(0.2)

    # The stub broken after a right answer: the kernel still holds the right answer, but the check must not grade it.
    _type_into(page, stub, "# ✏️ Exercise 1: my answer\n" + RIGHT[:-1])
    assert "SyntaxError" in _run(page, stub)
    text = _run(page, check)
    assert "✗ not yet. The exercise's cell above raised SyntaxError on its last run" in text, text
    assert "✓" not in text
    check.scroll_into_view_if_needed()
    page.screenshot(path=str(OUT / "exercise-broken-stub.png"))
    print(
        f"screenshots: {OUT.relative_to(REPO_ROOT)}/first-start.png, exercise-hint.png, exercise-correct.png, "
        "exercise-broken-stub.png"
    )
