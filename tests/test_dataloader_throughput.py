"""Unit tests for utils.data.SlowImages (notebook 11) and the timer of benchmarks/dataloader_throughput.py."""

import os

import pytest
import torch
from torch.utils.data import DataLoader

from benchmarks.dataloader_throughput import samples_per_second
from utils.data import SlowImages


def test_sample_layout_and_fixed_image():
    ds = SlowImages(5)
    image, label, pid = ds[3]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    assert label == 3 and pid == os.getpid()
    assert torch.equal(ds[3][0], image)  # the image of an index never changes
    assert not torch.equal(ds[2][0], image)


def test_io_ms_sleeps(monkeypatch):
    slept = []
    monkeypatch.setattr("utils.data.time.sleep", slept.append)
    SlowImages(2, io_ms=1.5)[0]
    SlowImages(2)[0]
    assert slept == [0.0015]  # only when io_ms > 0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"n": 0}, ValueError),
        ({"n": 2.0}, TypeError),
        ({"n": True}, TypeError),
        ({"io_ms": -1}, ValueError),
        ({"io_ms": "1"}, TypeError),
    ],
)
def test_bad_arguments(kwargs, error):
    with pytest.raises(error):
        SlowImages(**kwargs)


def test_index_out_of_range():
    with pytest.raises(IndexError, match="out of range"):
        SlowImages(3)[3]


def test_samples_per_second_counts_every_sample(monkeypatch):
    loader = DataLoader(SlowImages(10), batch_size=4)
    clock = iter([0.0, 2.0])  # the timer reads the clock once before and once after
    monkeypatch.setattr("benchmarks.dataloader_throughput.time.perf_counter", lambda: next(clock))
    assert samples_per_second(loader, epochs=2) == 20 / 2.0  # 2 epochs of 10 samples in 2 "seconds"
    monkeypatch.undo()
    with pytest.raises(ValueError, match="epochs"):
        samples_per_second(loader, epochs=0)
