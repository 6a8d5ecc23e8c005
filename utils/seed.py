"""Seeding every random number generator a course notebook touches. Used by every notebook."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int = 0, deterministic: bool = False) -> int:
    """Seed Python's ``random``, NumPy, and torch (CPU and every CUDA device).

    Args:
        seed: a non-negative integer below 2**32 (NumPy's limit).
        deterministic: also ask PyTorch for deterministic algorithms
            (``torch.use_deterministic_algorithms(True)``, which replaced the notes'
            ``torch.set_deterministic``; it also restricts cuDNN to deterministic
            algorithms), set ``cudnn.deterministic`` and turn off cuDNN's benchmark
            autotuner. Slower, but bit-for-bit repeatable on the same machine and software.
            ``False`` switches these back off (the benchmark flag is left as it was).

            ``CUBLAS_WORKSPACE_CONFIG`` is not set: PyTorch releases before late 2025
            required ``:4096:8`` or ``:16:8`` for deterministic cuBLAS calls, and read it only
            at the process's first cuBLAS call, so setting it here could come too late; the
            PyTorch the course teaches (course.toml) no longer requires it (it gives every cuBLAS
            handle and stream its own workspace; pytorch/pytorch#161749 removed the check).
            Notebook 12 shows this.

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
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = False if deterministic else torch.backends.cudnn.benchmark
    return seed
