"""Plotting helpers reused across notebooks (loss curves, image grids, matrices). Used by notebooks 02, 03, 04 and 05.

Each returns the matplotlib ``Figure`` so that a notebook can add to it, save it, or assert on
it. Figures are rendered as PNG in notebooks; nbval does not compare PNG images, so a notebook
asserts what a plot shows (the numbers behind it) in code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure


def plot_curves(
    curves: Mapping[str, Sequence[float]],
    xlabel: str = "epoch",
    ylabel: str = "",
    title: str = "",
    logy: bool = False,
) -> Figure:
    """Plot one line per entry of ``curves`` (name → values), e.g. train and test loss.

    Raises:
        TypeError: ``curves`` is not a mapping.
        ValueError: ``curves`` is empty or a curve has no values.
    """
    if not isinstance(curves, Mapping):
        raise TypeError(f"curves must be a mapping of name -> values, got {type(curves).__name__}")
    if not curves:
        raise ValueError("curves is empty: nothing to plot")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, values in curves.items():
        ys = [float(v) for v in values]
        if not ys:
            raise ValueError(f"curve {name!r} has no values")
        ax.plot(range(1, len(ys) + 1), ys, marker="o" if len(ys) < 30 else None, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_image_grid(
    images: torch.Tensor,
    titles: Sequence[str] | None = None,
    ncols: int = 8,
    cmap: str = "gray",
) -> Figure:
    """Show a batch of images ``[N, C, H, W]`` (C = 1 or 3) or ``[N, H, W]`` in a grid.

    Raises:
        TypeError: ``images`` is not a tensor.
        ValueError: the shape is not ``[N, H, W]`` / ``[N, C, H, W]`` with C in (1, 3), or the
            number of titles differs from N.
    """
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images must be a tensor, got {type(images).__name__}")
    if images.dim() == 3:
        images = images.unsqueeze(1)
    if images.dim() != 4 or images.shape[1] not in (1, 3) or images.shape[0] == 0:
        raise ValueError(
            f"images must have shape [N, H, W] or [N, C, H, W] with C in (1, 3), got {tuple(images.shape)}"
        )
    n = images.shape[0]
    if titles is not None and len(titles) != n:
        raise ValueError(f"got {len(titles)} titles for {n} images")
    if ncols < 1:
        raise ValueError(f"ncols must be >= 1, got {ncols}")
    ncols = min(ncols, n)
    nrows = (n + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(1.3 * ncols, 1.4 * nrows), squeeze=False)
    imgs = images.detach().cpu().float()
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= n:
            continue
        img = imgs[i]
        if img.shape[0] == 1:
            ax.imshow(img[0].numpy(), cmap=cmap)
        else:
            lo, hi = img.min(), img.max()
            ax.imshow(((img - lo) / (hi - lo + 1e-12)).permute(1, 2, 0).numpy())
        if titles is not None:
            ax.set_title(titles[i], fontsize=8)
    fig.tight_layout()
    return fig


def plot_matrix(
    matrix: torch.Tensor | np.ndarray,
    xlabels: Sequence[str] | None = None,
    ylabels: Sequence[str] | None = None,
    title: str = "",
    cmap: str = "viridis",
    annotate: bool = False,
) -> Figure:
    """Draw a 2-D matrix as a heat map (attention weights, confusion matrices, Jacobians).

    Raises:
        ValueError: the matrix is not 2-D or a label list has the wrong length.
    """
    m = matrix.detach().cpu().float().numpy() if isinstance(matrix, torch.Tensor) else np.asarray(matrix, dtype=float)
    if m.ndim != 2:
        raise ValueError(f"matrix must be 2-D, got shape {m.shape}")
    if xlabels is not None and len(xlabels) != m.shape[1]:
        raise ValueError(f"got {len(xlabels)} xlabels for {m.shape[1]} columns")
    if ylabels is not None and len(ylabels) != m.shape[0]:
        raise ValueError(f"got {len(ylabels)} ylabels for {m.shape[0]} rows")
    fig, ax = plt.subplots(figsize=(0.45 * m.shape[1] + 2, 0.45 * m.shape[0] + 1.2))
    im = ax.imshow(m, cmap=cmap)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    if xlabels is not None:
        ax.set_xticks(range(m.shape[1]), labels=list(xlabels), rotation=90)
    if ylabels is not None:
        ax.set_yticks(range(m.shape[0]), labels=list(ylabels))
    if annotate:
        for (r, c), v in np.ndenumerate(m):
            ax.text(c, r, f"{v:g}", ha="center", va="center", fontsize=7, color="w")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig
