"""The learner's package: what the notebooks import besides PyTorch. Used by every notebook.

What a notebook *teaches* stays in the notebook; ``utils/`` holds only what a notebook cannot keep in its own cells:

* shared helpers that two or more notebooks use, re-exported here (``from utils import get_device``):
  :mod:`utils.device`, :mod:`utils.seed`, :mod:`utils.printing`, :mod:`utils.paths` and :mod:`utils.plotting`;
  and, imported by module, :mod:`utils.data` (MNIST and spawn-safe datasets), :mod:`utils.tb` (reading TensorBoard
  logs back), :mod:`utils.checkpoint_files` (crash-proof checkpoints), :mod:`utils.launch` (``torchrun`` from a
  cell) and :mod:`utils.ddp` (what the ``torchrun`` scripts of notebooks 08 and 09 share);
* companions that must be importable although one notebook uses them: :mod:`utils.seq2seq` (notebook 05's corpus
  reading and batching, shared with its benchmark, tests and corpus generator) and :mod:`utils.shipped` (the data
  files' digests, checked by :mod:`utils.data` and :mod:`utils.seq2seq`);
* :mod:`utils.exercises`: every notebook's self-checking exercises and ``make progress``.

Each module's docstring names the notebooks that import it (``tests/test_layout.py`` checks it). Course tooling
(running and checking notebooks, generating the corpus) is not here but in ``tools/``.
"""

import importlib

from utils.device import DEVICE_ENV_VAR, get_device
from utils.paths import DATA_DIR, NOTEBOOKS_DIR, REPO_ROOT, relpath
from utils.printing import fmt, show, show_warning
from utils.seed import seed_everything

_LAZY = {"plot_curves": "utils.plotting", "plot_image_grid": "utils.plotting", "plot_matrix": "utils.plotting"}
"""Names re-exported on first use, with their module."""


def __getattr__(name: str):
    # The plotting helpers import matplotlib (about a second); worker processes of notebooks 08
    # and 09 import utils but never plot, so it is imported on first use only.
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'utils' has no attribute {name!r}")


__all__ = [
    "DATA_DIR",
    "DEVICE_ENV_VAR",
    "NOTEBOOKS_DIR",
    "REPO_ROOT",
    "fmt",
    "get_device",
    "plot_curves",
    "plot_image_grid",
    "plot_matrix",
    "relpath",
    "seed_everything",
    "show",
    "show_warning",
]
