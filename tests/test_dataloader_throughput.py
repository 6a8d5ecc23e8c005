"""Unit tests for the data set and timer of benchmarks/dataloader_throughput.py (used by notebook 09)."""

import os

import pytest
import torch
from torch.utils.data import DataLoader

from benchmarks.dataloader_throughput import SyntheticImages, samples_per_second


def test_sample_layout_and_fixed_image():
    ds = SyntheticImages(5, augment=False)
    image, label, draws, pid = ds[3]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    assert label == 3 and pid == os.getpid()
    assert torch.equal(draws, torch.zeros(3))
    assert torch.equal(ds[3][0], image)  # the image of an index never changes
    assert not torch.equal(ds[2][0], image)


def test_augmentation_uses_three_generators():
    ds = SyntheticImages(2)
    torch.manual_seed(0)
    first = ds[0]
    torch.manual_seed(0)
    second = ds[0]
    assert first[2][2] == second[2][2]  # the torch draw follows torch's seed
    assert torch.allclose(first[0] - first[2].sum(), SyntheticImages(2, augment=False)[0][0])


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"n": 0}, ValueError), ({"n": 2.0}, TypeError), ({"n": True}, TypeError),
    ({"io_ms": -1}, ValueError), ({"io_ms": "1"}, TypeError),
])
def test_bad_arguments(kwargs, error):
    with pytest.raises(error):
        SyntheticImages(**kwargs)


def test_index_out_of_range():
    with pytest.raises(IndexError, match="out of range"):
        SyntheticImages(3)[3]


def test_samples_per_second_counts_every_sample(monkeypatch):
    loader = DataLoader(SyntheticImages(10, augment=False), batch_size=4)
    clock = iter([0.0, 2.0])  # the timer reads the clock once before and once after
    monkeypatch.setattr("benchmarks.dataloader_throughput.time.perf_counter", lambda: next(clock))
    assert samples_per_second(loader, epochs=2) == 20 / 2.0  # 2 epochs of 10 samples in 2 "seconds"
    monkeypatch.undo()
    with pytest.raises(ValueError, match="epochs"):
        samples_per_second(loader, epochs=0)
