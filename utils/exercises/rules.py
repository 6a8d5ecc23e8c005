"""Checking *how* an exercise was answered, not only what it returned: the constraints an exercise states.
Used by no notebook. Lives in utils/ because the checks of the notebooks' exercises (``utils/exercises/nbNN.py``)
use it.

An exercise that says "without a Python loop", "with tensor operations, not autograd" or "use a hook" must
refuse an answer that breaks the rule even when its numbers are right, and say why the rule is there. Two kinds
of evidence, used together:

* **the answer's source** (its syntax tree): loops and comprehensions, and every name it refers to
  (``torch.cdist``, ``F.layer_norm``, ``vjp``). Functions of the learner's that the answer calls are read too,
  so moving the loop into a helper does not hide it. :func:`python_loops`, :func:`names_used`, :func:`refers_to`;
* **what happens when it runs**: which torch functions it called (:func:`torch_calls`, through
  ``TorchFunctionMode``, so an alias or ``getattr`` does not hide a call), and whether the autograd engine ran
  (:func:`autograd_runs`).

A learner's function defined in a notebook cell has its source in ``linecache`` (IPython puts it there, and
:func:`utils.exercises.section.run_sources` does the same), so :func:`inspect.getsource` finds it.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import linecache
import os
import textwrap
import types
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from utils.exercises import expect, hint, is_cell_file

LOOP_NODES: dict[type, str] = {
    ast.For: "a `for` loop",
    ast.AsyncFor: "an `async for` loop",
    ast.While: "a `while` loop",
    ast.ListComp: "a list comprehension",
    ast.SetComp: "a set comprehension",
    ast.DictComp: "a dict comprehension",
    ast.GeneratorExp: "a generator expression",
}
LOOPING_CALLS = {"map", "filter", "reduce", "functools.reduce", "itertools.starmap", "starmap"}
"""Builtins that run Python code once per element, like a loop."""


def _is_learners(fn: Any) -> bool:
    """A function defined in a notebook cell (IPython's or run_sources' file names), not in a library."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return False
    return is_cell_file(code.co_filename)


def _function(fn: Any) -> types.FunctionType | None:
    fn = inspect.unwrap(fn) if callable(fn) else fn
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    return fn if isinstance(fn, types.FunctionType) else None


def syntax(fn: Any) -> ast.AST | None:
    """The syntax tree of a function's source, or None when it cannot be read (a builtin, a lambda mid-line)."""
    fn = _function(fn)
    if fn is None:
        return None
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def functions_reached(fn: Any, limit: int = 20) -> list[types.FunctionType]:
    """``fn`` and the learner's own functions it refers to by a global name, recursively (helpers, methods of
    classes defined in cells are reached through the class)."""
    found: list[types.FunctionType] = []
    todo = [fn]
    while todo and len(found) < limit:
        f = _function(todo.pop())
        if f is None or f in found or not _is_learners(f):
            continue
        found.append(f)
        names = set()
        stack = [f.__code__]
        while stack:
            code = stack.pop()
            names |= set(code.co_names)
            stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        for name in names:
            value = f.__globals__.get(name)
            if isinstance(value, type):
                todo += [v for v in vars(value).values() if isinstance(v, types.FunctionType)]
            elif callable(value):
                todo.append(value)
    return found


def _trees(fn: Any) -> Iterator[tuple[str, ast.AST]]:
    for f in functions_reached(fn):
        tree = syntax(f)
        if tree is not None:
            yield f.__name__, tree


def python_loops(fn: Any) -> list[str]:
    """The Python loops in ``fn`` and in the learner's functions it calls, e.g. ``["a `for` loop in `nearest`"]``.
    A bare ``reduce(...)`` or ``map(...)`` counts only when it is the builtin or functools'/itertools' one (einops'
    ``reduce`` is a tensor operation)."""
    found = []
    for f in functions_reached(fn):
        tree = syntax(f)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if type(node) in LOOP_NODES:
                found.append(f"{LOOP_NODES[type(node)]} in `{f.__name__}`")
            elif isinstance(node, ast.Call) and _dotted(node.func) in LOOPING_CALLS:
                if _looping_origin(_dotted(node.func), f, tree):
                    found.append(f"`{_dotted(node.func)}(...)` in `{f.__name__}`")
    return found


_LOOPING_MODULES = {"builtins", "functools", "_functools", "itertools"}


def _looping_origin(name: str, f: types.FunctionType, tree: ast.AST) -> bool:
    """Whether the called ``name`` is Python's looping builtin (or functools'/itertools'), not a namesake such as
    ``einops.reduce``; when its origin cannot be told, it counts as a loop."""
    if "." in name:
        return True
    for node in ast.walk(tree):  # imported inside the function
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            return (node.module or "").split(".")[0] in _LOOPING_MODULES
    value = f.__globals__.get(name)
    if value is None:
        return True  # the builtin (or a name the check cannot see)
    module = getattr(value, "__module__", None) or ""
    return module.split(".")[0] in _LOOPING_MODULES or module == ""


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def names_used(fn: Any) -> set[str]:
    """Every name and dotted attribute chain in ``fn`` and the learner's functions it calls, with every suffix:
    ``torch.nn.functional.layer_norm`` gives it, ``nn.functional.layer_norm``, ``functional.layer_norm`` and
    ``layer_norm``. Imports inside the function count (``from torch.func import vjp`` gives ``torch.func.vjp``)."""
    found: set[str] = set()
    for _, tree in _trees(fn):
        for node in ast.walk(tree):
            chain = _dotted(node) if isinstance(node, (ast.Attribute, ast.Name)) else None
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    chain = f"{node.module}.{alias.name}"
                    found |= _suffixes(chain)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    found |= _suffixes(alias.name)
            if chain:
                found |= _suffixes(chain)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                found.add(node.value)  # getattr(torch, "cdist")
    for f in functions_reached(fn):  # a library function under another name: `from torch import cdist as cd`
        for value in global_values(f).values():
            name = getattr(value, "__name__", None)
            if callable(value) and isinstance(name, str) and not _is_learners(value):
                found |= _suffixes(f"{getattr(value, '__module__', None) or ''}.{name}".lstrip("."))
    return found


def _suffixes(chain: str) -> set[str]:
    parts = chain.split(".")
    return {".".join(parts[i:]) for i in range(len(parts))}


def refers_to(fn: Any, *names: str) -> str | None:
    """The first of ``names`` that ``fn`` (or a learner's function it calls) refers to, else None. A name is
    matched as a whole dotted suffix: ``"cdist"`` matches ``torch.cdist``, ``"autograd.grad"`` matches
    ``torch.autograd.grad`` but not ``p.grad``."""
    used = names_used(fn)
    return next((n for n in names if n in used), None)


def assigned_names(fn: Any) -> set[str]:
    """The names that ``fn`` and the learner's functions it calls bind themselves (assignments, arguments, loop
    targets, nested definitions): a local variable called ``layer_norm`` is not the library's function, so a
    check can skip such a name in :func:`refers_to`'s answer (and rely on what actually ran)."""
    found: set[str] = set()
    for _, tree in _trees(fn):
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                found.add(node.id)
            elif isinstance(node, ast.arg):
                found.add(node.arg)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not tree.body[0]:
                found.add(node.name)
    return found


def global_values(fn: Any) -> dict[str, Any]:
    """The learner's globals that ``fn`` reads (to inspect, say, a class it builds on)."""
    fn = _function(fn)
    return {} if fn is None else {n: fn.__globals__[n] for n in fn.__code__.co_names if n in fn.__globals__}


@contextlib.contextmanager
def torch_calls() -> Iterator[Counter]:
    """Count the torch functions called inside the block by name (``"cdist"``, ``"layer_norm"``, ``"matmul"``),
    however they were reached (an alias, ``getattr``, a method)."""
    from torch.overrides import TorchFunctionMode

    seen: Counter = Counter()

    class Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen[getattr(func, "__name__", str(func))] += 1
            return func(*args, **(kwargs or {}))

    with Recorder():
        yield seen


@contextlib.contextmanager
def autograd_runs() -> Iterator[list[int]]:
    """Count the autograd engine's runs inside the block (``backward()``, ``torch.autograd.grad``, and what
    ``torch.func.vjp``/``grad`` do through them): ``with autograd_runs() as runs: ...; runs[0]``."""
    import torch.autograd

    runs = [0]
    original: Callable = torch.autograd._engine_run_backward

    def counting(*args, **kwargs):
        runs[0] += 1
        return original(*args, **kwargs)

    torch.autograd._engine_run_backward = counting
    try:
        yield runs
    finally:
        torch.autograd._engine_run_backward = original


@contextlib.contextmanager
def counting_calls(owner: Any, name: str) -> Iterator[list[int]]:
    """Count calls of ``owner.name`` (a method of one object, or a function of a module) inside the block."""
    runs = [0]
    had_own = name in getattr(owner, "__dict__", {})
    original = getattr(owner, name)

    def counting(*args, **kwargs):
        runs[0] += 1
        return original(*args, **kwargs)

    setattr(owner, name, counting)
    try:
        yield runs
    finally:
        if had_own or isinstance(owner, types.ModuleType) or isinstance(owner, type):
            setattr(owner, name, original)
        else:
            delattr(owner, name)


@contextlib.contextmanager
def tensor_hooks() -> Iterator[Counter]:
    """Count the tensor hooks registered with ``Tensor.register_hook`` inside the block (``counts["registered"]``)
    and how many times they ran (``counts["ran"]``, also after the block, while the tensors live) and returned a
    gradient different from the one they got (``counts["changed"]``). Hooks on graph
    nodes (``grad_fn.register_prehook``) and module hooks are not seen: their classes cannot be patched."""
    import torch

    counts: Counter = Counter()
    original = torch.Tensor.register_hook

    def register_hook(self, hook):
        counts["registered"] += 1

        @functools.wraps(hook)
        def counted(grad):
            counts["ran"] += 1
            result = hook(grad)
            if isinstance(result, torch.Tensor) and not (result is grad or torch.equal(result, grad)):
                counts["changed"] += 1  # the hook replaced the gradient with a different one
            return result

        return original(self, counted)

    torch.Tensor.register_hook = register_hook
    try:
        yield counts
    finally:
        torch.Tensor.register_hook = original


@contextlib.contextmanager
def calls_to(*targets: Any) -> Iterator[Counter]:
    """Count the calls, inside the block, of the given library functions however they were reached: under an alias,
    through a re-export (``torch.nn.utils.fuse_conv_bn_weights`` is ``torch.nn.utils.fusion``'s function), bound
    before the block, or called by another library function. Keys are the targets' qualified names.

    A target is a Python function or method (matched by its code object, e.g. ``torch.optim.Optimizer.__init__``),
    a builtin function (matched by identity, e.g. ``pickle.loads``), or a method of a builtin class given through
    the class (``pickle.Unpickler.load``: any instance's ``load``). Uses :func:`sys.setprofile` for the current
    thread, and passes every event on to a profiler that was already set."""
    import sys

    codes, builtins, methods = {}, {}, {}
    for target in targets:
        name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
        function = _function(target)
        if function is not None:
            codes[function.__code__] = name
        elif hasattr(target, "__objclass__"):  # a method descriptor of a builtin class
            methods[(target.__objclass__, target.__name__)] = name
        else:
            builtins[id(target)] = name
    seen: Counter = Counter()
    previous = sys.getprofile()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            seen[codes[frame.f_code]] += 1
        elif event == "c_call":
            if id(arg) in builtins:
                seen[builtins[id(arg)]] += 1
            elif methods:
                owner = getattr(arg, "__self__", None)
                for (cls, method), name in methods.items():
                    if isinstance(owner, cls) and getattr(arg, "__name__", None) == method:
                        seen[name] += 1
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


def cell_source(**functions: Any) -> str:
    """The whole notebook cell that defined ``functions`` (given by name), as a program runs it: IPython and
    :func:`utils.exercises.section.run_sources` keep every cell's source in linecache. Hints when one is not a
    function of that cell, when they come from different cells, or when the cell cannot be read. The lines
    IPython made of magics (``get_ipython()`` calls) are blanked: a program has no IPython."""
    files = {}
    for name, fn in functions.items():
        if not isinstance(fn, types.FunctionType):
            hint(f"pass `{name}`, the function your exercise cell defines, not {type(fn).__name__} {fn!r:.60}")
        files[name] = fn.__code__.co_filename
    if len(set(files.values())) > 1:
        first = next(iter(files.values()))
        other = next(name for name, file in files.items() if file != first)
        hint(
            f"`{other}` was defined in another cell than the other functions: the check runs the exercise's cell "
            "as a program, so define them all there and run that cell again"
        )
    lines = linecache.getlines(next(iter(files.values())))
    expect(
        lines,
        "the check could not read the exercise's cell (its source is what runs on the 2 processes): run that "
        "cell again, then this one",
    )
    return "".join("\n" if "get_ipython()" in line else line for line in lines)


def write_program(name: str, text: str) -> Path:
    """Write a program into ``notebooks/runs/`` (where the lessons write theirs) in one step: another process
    checking at the same time never runs half a file. Returns its path."""
    from utils.paths import NOTEBOOKS_DIR

    runs = NOTEBOOKS_DIR / "runs"
    runs.mkdir(exist_ok=True)
    path = runs / name
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


__all__ = [
    "cell_source",
    "write_program",
    "assigned_names",
    "autograd_runs",
    "calls_to",
    "counting_calls",
    "functions_reached",
    "global_values",
    "names_used",
    "python_loops",
    "refers_to",
    "syntax",
    "tensor_hooks",
    "torch_calls",
]
