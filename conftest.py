"""Test-session setup shared by unit tests and nbval.

The notebook kernels that nbval starts inherit this process's environment, so the same
:data:`tools.notebooks.NOTEBOOK_ENV` that ``make execute`` uses is applied here. Importing ``utils``
imports torch, which has already read ``OMP_NUM_THREADS``; the unit tests in this process are held
to one thread explicitly, as two test workers share the two cores.
"""

import torch

from tools.notebooks import apply_test_env


def pytest_configure(config):  # noqa: ARG001 - pytest hook signature
    apply_test_env()
    torch.set_num_threads(1)
