"""Self-checking exercises (练习) at the end of every notebook, and ``make progress``.
Used by every notebook, in its "Exercises (练习)" section.

The checks for notebook ``NN`` live in ``utils/exercises/nbNN.py``; this module runs them and says what a
learner needs to hear:

* an untouched stub says **not attempted yet** (a value left as ``...``, or a function that still
  raises ``NotImplementedError``);
* a right answer says **correct**;
* a wrong one says **not yet**, with a hint that points back to the section to re-read. A check
  raises :class:`Hint` for the usual mistakes; an exception raised by the learner's own code is
  turned into a hint too (its type and first line, plus advice for well-known messages), never a
  raw traceback.

In a notebook::

    from utils.exercises import Checker
    ex = Checker("01")          # lists the exercises
    ...                         # a stub cell: ``answer = ...`` or ``def f(x): raise NotImplementedError``
    ex.check(1, answer)         # the check cell

``python -m utils.exercises`` (``make progress``) runs the exercise section of each notebook as it is
saved in ``notebooks/`` and prints which exercises pass. Solutions for teachers are in ``solutions/``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import random
import re
import reprlib
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

LOG_ENV_VAR = "TORCH_COURSE_EXERCISE_LOG"
"""When set, every check also appends one JSON line to this file (read by ``make progress``)."""

NOT_ATTEMPTED = "not attempted"
CORRECT = "correct"
WRONG = "not yet"


class Hint(Exception):
    """Raised by a check for a known wrong answer: what is wrong, and which section to re-read."""

    def __init__(self, message: str, section: str | None = None):
        super().__init__(message)
        self.message = message
        self.section = section


class NotAttempted(NotImplementedError):
    """Raised by a check whose stub is untouched in another way than ``...`` or ``raise NotImplementedError`` (a
    program with blanks, say): the check says *not attempted yet* with this message, which tells what to fill in."""


def hint(message: str, section: str | None = None) -> None:
    """Stop the check with a hint (shorthand for ``raise Hint(...)``)."""
    raise Hint(message, section)


def expect(condition: bool, message: str, section: str | None = None) -> None:
    """Hint unless ``condition`` holds."""
    if not condition:
        raise Hint(message, section)


@dataclass
class Exercise:
    number: int
    title: str
    section: str  # the section of the notebook to re-read, as its heading says
    run: Callable[..., str | None]  # raises Hint when wrong; may return a remark when right


@dataclass
class Registry:
    """The exercises of one notebook, filled by the :meth:`exercise` decorator in ``nbNN.py``."""

    notebook: str
    exercises: dict[int, Exercise] = field(default_factory=dict)

    def exercise(self, number: int, title: str, section: str):
        def register(run: Callable[..., str | None]) -> Callable[..., str | None]:
            if number in self.exercises:
                raise ValueError(f"exercise {number} of notebook {self.notebook} is registered twice")
            self.exercises[number] = Exercise(number, title, section, run)
            return run

        return register


# Advice for exceptions that learners' code commonly raises: (pattern in the message, advice, notebook section).
KNOWN_ERRORS: list[tuple[str, str, str]] = [
    (
        r"view size is not compatible with input tensor's size and stride",
        "`view` cannot express this shape with the tensor's strides (a transposed tensor, say): use `reshape`, "
        "which copies only when it must",
        "01 · 4. Memory layout: storage, strides, views (存储、步长与视图)",
    ),
    (
        r"shape '\[.*\]' is invalid for input of size",
        "the new shape must hold exactly as many elements as the tensor: compute sizes from `x.shape` (or use -1 "
        "once) instead of typing numbers",
        "01 · 3. Dimensions and shapes (维度与尺寸)",
    ),
    (
        r"shapes cannot be multiplied|size mismatch|must match the size of tensor",
        "the shapes do not fit: print `.shape` of each operand and check which dimension should match",
        "01 · 7. Broadcasting (广播) and matrix products (矩阵乘法)",
    ),
    (
        r"expected scalar type|expected .*dtype|found dtype|must have the same dtype",
        "two tensors have different dtypes: convert one with `.to(dtype)` or `.float()`",
        "01 · 2. Data types (数据类型)",
    ),
    (
        r"does not require grad and does not have a grad_fn",
        "nothing in this computation requires a gradient: the leaf needs `requires_grad=True`, and the path from it to "
        "the loss must not pass through `.detach()`, `.data`, `.item()` or `torch.no_grad()`",
        "02 · 2. `backward()` on a scalar, and `torch.autograd.grad`",
    ),
    (
        r"backward through the graph a second time",
        "backward frees the graph it used: build the graph again, "
        "or pass `retain_graph=True` if you truly need it twice",
        "03 · 3. The graph is freed after `backward` (计算图在反向传播后立即销毁)",
    ),
    (
        r"leaf Variable that requires grad is being used in an in-place operation",
        "update parameters inside `with torch.no_grad():`",
        "03 · 8. In-place operations that break autograd (原地操作)",
    ),
    (
        r"Expected all tensors to be on the same device",
        "move every tensor and the model to one device with `.to(device)`",
        "01 · 11. Devices (设备)",
    ),
]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # torch.load's refusals are coloured for a terminal


def _first_line(exc: BaseException) -> str:
    text = _ANSI.sub("", str(exc)).strip().splitlines()
    return text[0] if text else ""


def _explain_exception(exc: BaseException) -> tuple[str, str | None]:
    message = _ANSI.sub("", str(exc))
    frame = _learner_frame(exc)
    if frame is None:  # raised by the check itself, or by PyTorch called by the check on the answer
        said = f"the check could not use your answer ({type(exc).__name__}: {_first_line(exc)[:200]})"
    else:
        said = f"your code raised {type(exc).__name__}{frame}: {_first_line(exc)[:200]}"
    for pattern, advice, section in KNOWN_ERRORS:
        if re.search(pattern, message, re.I):
            return f"{said.rstrip('.')}. {_sentence(advice)}", section
    return said, None


def is_cell_file(filename: str) -> bool:
    """Whether code of this file name was written in a notebook cell: IPython compiles a cell under a file of
    ``ipykernel``'s, :func:`utils.exercises.section.run_sources` under ``<cell-N>``."""
    return "ipykernel" in filename or filename.startswith("<")


def _learner_frame(exc: BaseException) -> str | None:
    """Where the exception passed through the learner's code ("" if not in a named function), else None."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if is_cell_file(frame.filename):
            return f" in `{frame.name}` (line {frame.lineno} of its cell)" if frame.name != "<module>" else ""
    return None


def attempted(value: Any) -> bool:
    """A value left as ``...`` (the stub) has not been attempted."""
    return value is not Ellipsis


@contextlib.contextmanager
def _own_random_state():
    """A check draws random numbers of its own: afterwards the learner's generators are as they were."""
    import numpy as np
    import torch

    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


@contextlib.contextmanager
def _check_mode():
    """A check runs with gradients on, whatever an earlier cell of the learner's set (``set_grad_enabled(False)``
    would fail a right answer); the learner's own setting is back afterwards."""
    import torch

    with torch.enable_grad():
        yield


def _stub_raised(exc: NotImplementedError) -> bool:
    """The stub's own ``raise NotImplementedError``: raised in a notebook cell, not deeper (``nn.Module`` raises
    NotImplementedError for a misspelt ``forward``; an operator for a tensor it does not support)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and is_cell_file(frames[-1].filename)


def _arity_problem(exercise: Exercise, number: int, answers: tuple) -> str | None:
    """One line when the check cell passes more or fewer answers than the check takes."""
    import inspect

    try:
        params = inspect.signature(exercise.run).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [p.name for p in positional]
    required = [p.name for p in positional if p.default is p.empty]
    if len(required) <= len(answers) <= len(names):
        return None
    return (
        f"`ex.check({number}, ...)` takes {len(names)} answer(s) after the exercise number, got {len(answers)}: "
        f"keep the check cell as it was written (restore it from the lesson if it was edited)"
    )


def judge(registry: Registry, number: int, *answers: Any) -> tuple[str, str]:
    """Run one check; return (status, message) without printing."""
    exercise = registry.exercises[number]
    if any(a is Ellipsis for a in answers):
        return NOT_ATTEMPTED, "Replace the `...` in the cell above with your answer, run that cell, then this one."
    if problem := _arity_problem(exercise, number, answers):
        return WRONG, problem
    try:
        with _own_random_state(), _check_mode():
            remark = exercise.run(*answers)
    except NotAttempted as exc:
        return NOT_ATTEMPTED, str(exc)
    except NotImplementedError as exc:
        if _stub_raised(exc):
            return (
                NOT_ATTEMPTED,
                "Write your code in place of `raise NotImplementedError` above, run that cell, then this one.",
            )
        message, section = _explain_exception(exc)
        return WRONG, _with_section(message, section or exercise.section)
    except Hint as h:
        return WRONG, _with_section(h.message, h.section or exercise.section)
    except KeyboardInterrupt:
        raise  # the learner stopped the kernel: let it stop
    except BaseException as exc:  # noqa: BLE001 - the learner's code failed (sys.exit included): one line, no traceback
        message, section = _explain_exception(exc)
        return WRONG, _with_section(message, section or exercise.section)
    return CORRECT, remark or ""


def _sentence(message: str) -> str:
    """Upper-case the first letter when the message starts with an English word, not a name from the code."""
    m = re.match(r"([a-z]+) ", message)
    if m and (len(m.group(1)) > 1 or m.group(1) == "a") and m.group(1) not in _NAMES:
        return message[:1].upper() + message[1:]
    return message


_NAMES = {"eps", "idx", "var", "lr", "loss", "grad", "model", "optimizer", "scaler", "mask"}


MAX_HINT = 600
"""A hint longer than this (an answer's huge ``repr`` in it) is cut in the middle."""


def _bounded(text: str, limit: int = MAX_HINT) -> str:
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]} … ({len(text) - limit:,} characters left out) … {text[-limit // 4 :]}"


def _with_section(message: str, section: str) -> str:
    text = _sentence(_bounded(message).rstrip("."))
    return f"{text}{'' if text.endswith(('?', '!')) else '.'} Re-read “{section}”."


def _returned_none_hint(value: Any) -> None:
    if value is None:
        hint("your function returned None: did you forget `return`?")


STUB_MARK = "# ✏️ Exercise "
"""The first line of an exercise's stub cell starts with it: ``# ✏️ Exercise 2: ...``."""
_CHECK_CALL = re.compile(r"\bex\.check\((\d+)")
_STUB = re.compile(r"^# ✏️ Exercise (\d+)\b")

_failed_stubs: dict[int, str] = {}
"""Exercise number -> the error its stub cell raised on its last run, in this kernel (none: it ran or never did)."""
_previous_cell: dict[str, str | None] = {"error": None}
"""The error the cell run just before the current one raised (a stub whose first line was deleted is still seen)."""


def stub_failed(number: int, error: BaseException | None) -> None:
    """Record how an exercise's stub cell ended its last run (``error`` None: it ran to the end)."""
    if error is None:
        _failed_stubs.pop(number, None)
    else:
        _failed_stubs[number] = type(error).__name__


def failed_stubs() -> dict[int, str]:
    """{exercise number: the error its stub cell raised on its last run}, in this kernel."""
    return dict(_failed_stubs)


def previous_cell_failed(error: BaseException | None, is_check: bool = False) -> None:
    """Record how the cell that just ran ended (a check cell's own errors do not count)."""
    _previous_cell["error"] = None if (error is None or is_check) else type(error).__name__


def stub_error(number: int) -> str | None:
    """The error to report instead of grading exercise ``number``: its stub's last run, or the cell just before."""
    return _failed_stubs.get(number) or _previous_cell["error"]


def reset_stubs() -> None:
    """Forget every stub's last run (a fresh namespace)."""
    _failed_stubs.clear()
    _previous_cell["error"] = None


def failed_stub_message(number: int, error_name: str) -> str:
    """The check's answer when the stub's last run raised: the answer in memory is an older one."""
    return (
        f"Exercise {number} (练习 {number}): ✗ not yet. The exercise's cell above raised {error_name} on its last "
        "run, so what the kernel holds is not your answer: fix the cell, run it again, then this one."
    )


def missing_name_message(number: int, name: str) -> str:
    """The check's answer when the learner's answer does not exist yet (the stub was not run)."""
    return (
        f"Exercise {number} (练习 {number}): ○ not attempted yet. `{name}` is not defined: run the exercise's "
        f"cell first (the one above, starting with `{STUB_MARK}{number}`), then this one."
    )


def _watch_cells() -> None:
    """In IPython (JupyterLab, nbclient), note whether each stub cell's last run raised, and answer a check cell
    run before its stub with one line instead of a NameError traceback. Installed once per kernel."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is None or getattr(ip, "_torch_course_watch", False):
        return

    def after(result) -> None:
        cell = (result.info.raw_cell or "") if result.info else ""
        error = result.error_before_exec or result.error_in_exec
        if m := _STUB.match(cell.lstrip()):
            stub_failed(int(m.group(1)), error)
        previous_cell_failed(error, is_check=bool(_CHECK_CALL.search(cell)))

    def on_name_error(shell, etype, value, tb, tb_offset=None):
        cell = (shell.user_ns.get("In") or [""])[-1]
        m, name = _CHECK_CALL.search(cell), re.search(r"name '(\w+)' is not defined", str(value))
        if m and name and name.group(1) != "ex":
            number = int(m.group(1))
            if error := stub_error(number):
                print(failed_stub_message(number, error))
            else:
                print(missing_name_message(number, name.group(1)))
            return None
        return shell.showtraceback((etype, value, tb), tb_offset=tb_offset)

    ip.events.register("post_run_cell", after)
    ip.set_custom_exc((NameError,), on_name_error)
    ip._torch_course_watch = True


class Checker:
    """The exercises of one notebook, as seen from the notebook's cells."""

    def __init__(self, notebook: str | int, quiet: bool = False):
        # The first optimizer step or checkpoint of a process imports torch._dynamo (about 2 s): pay that once
        # here, in the exercise section's first cell, so that no check takes longer than a second or two.
        import torch._dynamo  # noqa: F401

        notebook = f"{notebook:02d}" if isinstance(notebook, int) and not isinstance(notebook, bool) else notebook
        if not (isinstance(notebook, str) and re.fullmatch(r"\d\d", notebook)):
            raise ValueError(f'Checker({notebook!r}): give the notebook\'s two-digit number, e.g. Checker("01")')
        try:
            module = importlib.import_module(f"utils.exercises.nb{notebook}")
        except ModuleNotFoundError as exc:
            if exc.name != f"utils.exercises.nb{notebook}":
                raise
            raise ValueError(f"Checker({notebook!r}): this course has no exercises for a notebook {notebook}") from None
        if not module.EXERCISES.exercises:  # emptied by an earlier cell: build it again
            module = importlib.reload(module)
        self.notebook = notebook
        self.registry: Registry = module.EXERCISES
        _watch_cells()
        if not quiet:
            print(f"Notebook {notebook}: {len(self.registry.exercises)} exercises")
            for ex in self.registry.exercises.values():
                print(f"  {ex.number}. {ex.title}")

    def check(self, number: int, *answers: Any) -> None:
        if number not in self.registry.exercises:
            known = ", ".join(str(n) for n in sorted(self.registry.exercises))
            print(
                f"There is no exercise {number!r} in notebook {self.notebook}: its exercises are {known} "
                "(write the number as an int, e.g. ex.check(1, ...))."
            )
            return
        if error := stub_error(number):
            status = WRONG
            print(failed_stub_message(number, error))
        else:
            status, message = judge(self.registry, number, *answers)
            mark = {CORRECT: "✓ correct", WRONG: "✗ not yet", NOT_ATTEMPTED: "○ not attempted yet"}[status]
            line = f"Exercise {number} (练习 {number}): {mark}"
            print(f"{line}. {message}" if message else f"{line}.")
        self.log(number, status)

    def log(self, number: int, status: str) -> None:
        """Append the check's result to the progress log (``make progress`` sets :data:`LOG_ENV_VAR`)."""
        log = os.environ.get(LOG_ENV_VAR)
        if log:
            with open(log, "a", encoding="utf-8") as f:
                f.write(json.dumps({"notebook": self.notebook, "exercise": number, "status": status}) + "\n")


def shape_answer(value: Any, name: str, example: str = "(2, 3)") -> tuple:
    """A predicted shape as a tuple of ints; hint when it is written otherwise."""
    expect(
        isinstance(value, (tuple, list)) and all(isinstance(v, int) for v in value),
        f"{name}: write a shape as a tuple of ints, e.g. {example}",
    )
    return tuple(value)


def number_answer(value: Any, name: str) -> int | float:
    """A predicted number (int or float, not bool); hint when it is something else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    shown = reprlib.repr(value)
    if shown.startswith("<"):  # an object's default repr, <module.Class object at 0x...>: its type says enough
        hint(f"{name} should be a number, not an object of class {type(value).__name__}")
    hint(f"{name} should be a number, not {type(value).__name__} {shown}")


def returns(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Call the learner's function; hint if it returns None (a forgotten ``return``)."""
    value = fn(*args, **kwargs)
    _returned_none_hint(value)
    return value


__all__ = [
    "Checker",
    "Exercise",
    "Hint",
    "NotAttempted",
    "Registry",
    "attempted",
    "expect",
    "hint",
    "judge",
    "number_answer",
    "returns",
    "shape_answer",
]
