"""Shared helpers for the torch-course notebooks.

Only what two or more notebooks would otherwise repeat lives here: choosing a device,
seeding, stable printing, plotting and paths. What a notebook *teaches* stays in the notebook.

Typical use in a notebook::

    from utils import get_device, seed_everything, show
"""

from utils.device import DEVICE_ENV_VAR, get_device
from utils.paths import DATA_DIR, NOTEBOOKS_DIR, REPO_ROOT, relpath
from utils.seed import seed_everything
from utils.printing import fmt, show, show_warning

_LAZY = {"plot_curves", "plot_image_grid", "plot_matrix"}


def __getattr__(name: str):
    # The plotting helpers import matplotlib (about a second); worker processes of notebooks 08
    # and 09 import utils but never plot, so it is imported on first use only.
    if name in _LAZY:
        from utils import plotting

        return getattr(plotting, name)
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
