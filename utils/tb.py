"""Reading TensorBoard event files back, so a notebook can prove what it logged. Used by notebooks 03 and 04.

Writing stays visible in the notebooks (``SummaryWriter.add_scalar``/``add_image``/``add_graph``);
this module only reads, with TensorBoard's own event reader.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


@dataclass
class EventSummary:
    """What one run folder of TensorBoard events contains."""

    scalars: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    """tag → [(step, value), ...]"""
    images: dict[str, int] = field(default_factory=dict)
    """tag → number of images logged"""
    graph_nodes: int = 0
    """number of nodes in the logged model graph (0 when no graph was logged)"""
    hparams: list[str] = field(default_factory=list)
    """tags of the hyper-parameter records (``add_hparams``); empty when none were logged"""


def read_events(logdir: str | os.PathLike[str]) -> EventSummary:
    """Read every event file directly in ``logdir`` and summarise it.

    Raises:
        FileNotFoundError: ``logdir`` does not exist or holds no ``events.out.tfevents.*`` file.
    """
    path = Path(logdir)
    if not path.is_dir():
        raise FileNotFoundError(f"TensorBoard run folder {path} does not exist")
    if not any(path.glob("events.out.tfevents.*")):
        raise FileNotFoundError(f"no TensorBoard event file (events.out.tfevents.*) in {path}")
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    summary = EventSummary()
    for tag in tags.get("scalars", []):
        summary.scalars[tag] = [(e.step, float(e.value)) for e in acc.Scalars(tag)]
    for tag in tags.get("images", []):
        summary.images[tag] = len(acc.Images(tag))
    if tags.get("graph"):
        summary.graph_nodes = len(acc.Graph().node)
    try:
        summary.hparams = sorted(acc.PluginTagToContent("hparams"))
    except KeyError:  # TensorBoard's way of saying "no hparams were logged"
        summary.hparams = []
    return summary
