"""Import the code a notebook teaches, from the notebook itself.
Run by ``benchmarks/seq2seq_speed.py``, ``tests/test_seq2seq.py`` and ``tests/test_mnist_loop.py``.

Notebook 05 writes its models, training step, decoding and evaluation in its own cells, where a
learner reads and edits them, and notebook 04 its training loop. ``benchmarks/seq2seq_speed.py``,
``tests/test_seq2seq.py`` and ``tests/test_mnist_loop.py`` need the same code; rather than keep a
second copy in ``utils/``, they run the notebook's *shared* cells:
the code cells whose first line starts with :data:`SHARED_MARK`, in order, from the notebook's
jupytext source (``notebooks/src/NN_topic.py``). Nothing else of the notebook runs (no training, no plots).

    >>> lesson = load("05_seq2seq_translation")       # doctest: +SKIP
    >>> model = lesson.build_model("content", src_lang, tgt_lang)   # doctest: +SKIP
"""

from __future__ import annotations

import functools
import sys
import types

from utils.paths import SOURCES_DIR

SHARED_MARK = "# Shared with benchmarks/ and tests/"
"""First line of a notebook code cell that :func:`load` runs."""


def shared_cells(source: str) -> list[str]:
    """The code of the shared cells of a jupytext percent-format ``source``, in order."""
    cells: list[list[str]] = []
    current: list[str] | None = None
    for line in source.splitlines():
        if line.startswith("# %%"):
            current = [] if line.strip() == "# %%" else None  # a code cell, or markdown (ignored)
            if current is not None:
                cells.append(current)
        elif current is not None:
            current.append(line)
    codes = ["\n".join(cell).strip("\n") for cell in cells]
    return [code for code in codes if code.startswith(SHARED_MARK)]


@functools.cache
def load(notebook: str) -> types.ModuleType:
    """Run the shared cells of ``notebooks/src/<notebook>.py`` in a fresh module and return it.

    Raises:
        FileNotFoundError: no such notebook source (names the path).
        LookupError: the notebook has no shared cell.
    """
    path = SOURCES_DIR / f"{notebook}.py"
    if not path.is_file():
        raise FileNotFoundError(
            f"no notebook source at {path} (give the name without .py, e.g. '05_seq2seq_translation')"
        )
    cells = shared_cells(path.read_text(encoding="utf-8"))
    if not cells:
        raise LookupError(f"{path} has no code cell starting with {SHARED_MARK!r}")
    module = types.ModuleType(f"lesson_{notebook}", f"The shared cells of {path.name}.")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module  # classes defined there can be pickled and inspected
    for number, code in enumerate(cells, 1):
        exec(compile(code, f"{path.name} [shared cell {number}]", "exec"), module.__dict__)  # noqa: S102
    return module
