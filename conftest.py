"""Test-session setup shared by unit tests and nbval.

The notebook kernels that nbval starts inherit this process's environment, so the same
:data:`tools.notebooks.NOTEBOOK_ENV` that ``make execute`` uses is applied here. Importing ``utils``
imports torch, which has already read ``OMP_NUM_THREADS``; the unit tests in this process are held
to one thread explicitly, as two test workers share the two cores.
"""

import torch

from tools.notebooks import CELL_TIMEOUT_S, apply_test_env

NBVAL_DEFAULT_CELL_TIMEOUT_S = 2000
"""nbval's own default: the value seen when --nbval-cell-timeout was not given."""


def pytest_configure(config):
    apply_test_env()
    if config.option.nbval_cell_timeout == NBVAL_DEFAULT_CELL_TIMEOUT_S:
        config.option.nbval_cell_timeout = CELL_TIMEOUT_S
    torch.set_num_threads(1)
