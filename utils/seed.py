"""Seeding every random number generator a course notebook touches."""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def seed_everything(seed: int = 0, deterministic: bool = False) -> int:
    """Seed Python's ``random``, NumPy, and torch (CPU and every CUDA device).

    Args:
        seed: a non-negative integer below 2**32 (NumPy's limit).
        deterministic: also ask PyTorch for deterministic algorithms
            (``torch.use_deterministic_algorithms(True)``, which replaced the notes'
            ``torch.set_deterministic``), turn off cuDNN's benchmark autotuner and set
            ``CUBLAS_WORKSPACE_CONFIG`` as CUDA requires. Slower, but bit-for-bit repeatable.
            ``False`` switches these back off.

    Returns:
        The seed, so that a notebook can print or log it.

    Raises:
        TypeError: ``seed`` is not an int (a float seed silently truncates elsewhere).
        ValueError: ``seed`` is negative or too large.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    seed = int(seed)
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = False if deterministic else torch.backends.cudnn.benchmark
    return seed
