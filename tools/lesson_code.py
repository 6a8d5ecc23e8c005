"""Import the code a notebook teaches, from the notebook itself.
Run by ``benchmarks/seq2seq_speed.py``, ``tests/test_seq2seq.py`` and ``tests/test_mnist_loop.py``.

Notebook 05 writes its models, training step, decoding and evaluation in its own cells, where a
learner reads and edits them, and notebook 04 its models and training loop. The benchmarks and tests need the
same code; rather than keep a second copy in ``utils/``, they run the notebook's *shared* cells: the code cells
tagged ``shared`` (``# %% tags=["shared"]`` in the jupytext source ``notebooks/src/NN_topic.py``; a cell tag,
which a learner does not see in the lesson), in order. Nothing else of the notebook runs (no training, no plots).

    >>> lesson = load("05_seq2seq_translation")       # doctest: +SKIP
    >>> model = lesson.build_model("content", src_lang, tgt_lang)   # doctest: +SKIP
"""

from __future__ import annotations

import functools
import sys
import types

import jupytext

from utils.paths import SOURCES_DIR

SHARED_TAG = "shared"
"""The cell tag of a notebook code cell that :func:`load` runs."""


def shared_cells(source: str) -> list[str]:
    """The code of the cells tagged :data:`SHARED_TAG` of a jupytext percent-format ``source``, in order."""
    nb = jupytext.reads(source, fmt="py:percent")
    return [
        cell.source for cell in nb.cells if cell.cell_type == "code" and SHARED_TAG in cell.metadata.get("tags", [])
    ]


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
        raise LookupError(f"{path} has no code cell tagged {SHARED_TAG!r} (a line '# %% tags=[\"{SHARED_TAG}\"]')")
    module = types.ModuleType(f"lesson_{notebook}", f"The shared cells of {path.name}.")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module  # classes defined there can be pickled and inspected
    for number, code in enumerate(cells, 1):
        exec(compile(code, f"{path.name} [shared cell {number}]", "exec"), module.__dict__)  # noqa: S102
    return module
