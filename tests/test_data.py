"""Tests of utils.data: MNIST from the shipped files, the error messages, loaders and datasets."""

from __future__ import annotations

import gzip
import hashlib
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torchvision.datasets import MNIST
from torchvision.transforms import v2

from utils.data import (
    MD5_LIST,
    MNIST_FILES,
    MNIST_MEAN,
    MNIST_SOURCE_DIR,
    MNIST_STD,
    DataFileError,
    NegatedPairs,
    WorkerTagged,
    load_mnist,
    mnist_tensors,
    prepare_mnist,
    seed_worker,
    tensor_loader,
)

# ------------------------------------------------------------------ tiny fake MNIST sources
# prepare_mnist only decompresses and checks MD5s, so its error handling is tested on small
# fake files with their own MD5SUMS.raw (fast); the real files are used once, below.


def _make_fake_source(folder: Path) -> dict[str, bytes]:
    folder.mkdir(parents=True)
    contents = {name: f"fake contents of {name}\n".encode() * 50 for name in MNIST_FILES}
    lines = []
    for name, data in contents.items():
        (folder / f"{name}.gz").write_bytes(gzip.compress(data))
        lines.append(f"{hashlib.md5(data).hexdigest()}  {name}")
    (folder / MD5_LIST).write_text("\n".join(lines) + "\n")
    return contents


@pytest.fixture
def fake(tmp_path: Path) -> tuple[Path, Path, dict[str, bytes]]:
    src, root = tmp_path / "mnist", tmp_path / "root"
    return src, root, _make_fake_source(src)


def test_prepare_decompresses_into_torchvision_layout(fake):
    src, root, contents = fake
    raw = prepare_mnist(src, root)
    assert raw == root / "MNIST" / "raw"
    for name, data in contents.items():
        assert (raw / name).read_bytes() == data
    assert not list(raw.glob("*.tmp")), "no temporary file is left behind"


def test_prepare_keeps_good_files_and_repairs_bad_ones(fake):
    src, root, contents = fake
    raw = prepare_mnist(src, root)
    target = raw / MNIST_FILES[0]
    mtime = target.stat().st_mtime_ns
    prepare_mnist(src, root)
    assert target.stat().st_mtime_ns == mtime, "a file with the right MD5 is not rewritten"
    target.write_bytes(b"damaged")
    prepare_mnist(src, root)
    assert target.read_bytes() == contents[MNIST_FILES[0]]


def test_missing_gz_names_the_file(fake):
    src, root, _ = fake
    (src / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError, match=r"t10k-labels-idx1-ubyte\.gz is missing.*git checkout -- data/mnist/"):
        prepare_mnist(src, root)


def test_missing_md5_list(fake):
    src, root, _ = fake
    (src / MD5_LIST).unlink()
    with pytest.raises(FileNotFoundError, match=r"MD5SUMS\.raw is missing"):
        prepare_mnist(src, root)


def test_md5_list_without_an_entry(fake):
    src, root, _ = fake
    lines = (src / MD5_LIST).read_text().splitlines()
    (src / MD5_LIST).write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(DataFileError, match=r"no MD5 sum for t10k-labels-idx1-ubyte"):
        prepare_mnist(src, root)


def test_truncated_gz_names_the_file(fake):
    src, root, _ = fake
    gz = src / "train-labels-idx1-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:-12])
    with pytest.raises(DataFileError, match=r"train-labels-idx1-ubyte\.gz is truncated or corrupt.*git checkout"):
        prepare_mnist(src, root)
    assert not (root / "MNIST" / "raw" / "train-labels-idx1-ubyte").exists()
    assert not list((root / "MNIST" / "raw").glob("*.tmp"))


def test_not_gzip_names_the_file(fake):
    src, root, _ = fake
    (src / "t10k-images-idx3-ubyte.gz").write_bytes(b"this is not gzip data at all")
    with pytest.raises(DataFileError, match=r"t10k-images-idx3-ubyte\.gz is truncated or corrupt"):
        prepare_mnist(src, root)


def test_wrong_contents_fail_the_md5_check(fake):
    src, root, _ = fake
    (src / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(b"valid gzip, wrong data"))
    with pytest.raises(DataFileError, match=r"train-images-idx3-ubyte\.gz decompresses to data with MD5 .* corrupt"):
        prepare_mnist(src, root)


def test_bad_argument_types():
    with pytest.raises(TypeError, match="source_dir must be a path"):
        prepare_mnist(source_dir=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="train must be a bool"):
        load_mnist(train="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="std must be > 0"):
        mnist_tensors(std=0.0)


# ------------------------------------------------------------------ the real shipped files
# decompressed to the default place, data/MNIST/raw, once; later runs reuse it as the notebooks do


def test_shipped_files_are_complete():
    for name in MNIST_FILES:
        assert (MNIST_SOURCE_DIR / f"{name}.gz").is_file()
    assert (MNIST_SOURCE_DIR / MD5_LIST).is_file()


def test_load_mnist_returns_torchvision_datasets():
    test_set = load_mnist(train=False)
    train_set = load_mnist(train=True)
    assert isinstance(test_set, MNIST) and isinstance(train_set, MNIST)
    assert len(train_set) == 60000 and len(test_set) == 10000
    assert test_set.data.shape == (10000, 28, 28) and test_set.data.dtype == torch.uint8
    assert sorted(test_set.targets.unique().tolist()) == list(range(10))
    assert (prepare_mnist() / "t10k-images-idx3-ubyte").is_file()
    img, label = test_set[0]
    assert img.size == (28, 28) and label == 7  # the first test digit is a 7


def test_mnist_tensors_equal_the_v2_pipeline():
    x, y = mnist_tensors(train=False)
    assert x.shape == (10000, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    tf = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize([MNIST_MEAN], [MNIST_STD])])
    ds = load_mnist(train=False, transform=tf)
    for i in (0, 1, 9999):
        img, label = ds[i]
        assert torch.equal(x[i], img.as_subclass(torch.Tensor))
        assert y[i].item() == label


# ------------------------------------------------------------------ tensor_loader


def test_tensor_loader_matches_a_plain_dataloader():
    x, y = torch.arange(50.0).view(25, 2), torch.arange(25)
    fast = tensor_loader(x, y, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3))
    slow = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3))
    assert len(fast) == len(slow) == 7
    for (fx, fy), (sx, sy) in zip(fast, slow, strict=True):
        assert torch.equal(fx, sx) and torch.equal(fy, sy)
    assert len(tensor_loader(x, y, batch_size=4, drop_last=True)) == 6
    first_x, _ = next(iter(tensor_loader(x, y, batch_size=4)))
    assert torch.equal(first_x, x[:4])


def test_tensor_loader_errors():
    with pytest.raises(TypeError, match="one or more tensors"):
        tensor_loader(batch_size=2)
    with pytest.raises(ValueError, match="same first dimension"):
        tensor_loader(torch.zeros(3), torch.zeros(4), batch_size=2)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        tensor_loader(torch.zeros(3), batch_size=0)


# ------------------------------------------------------------------ datasets for workers


def test_negated_pairs_is_the_notes_dataset_with_bounds():
    ds = NegatedPairs(3)
    assert len(ds) == 3 and ds[2].tolist() == [-4, -4] and ds[-1].tolist() == [-4, -4]
    with pytest.raises(IndexError, match="out of range"):
        ds[3]
    with pytest.raises(ValueError, match="length must be"):
        NegatedPairs(-1)


def test_worker_datasets_pickle_and_run_in_workers():
    ds = pickle.loads(pickle.dumps(WorkerTagged(6)))  # what a spawned worker receives
    assert ds[0][:2] == (0, -1)

    def rows(seed: int) -> list[tuple[int, ...]]:
        loader = DataLoader(
            ds, batch_size=3, num_workers=2, worker_init_fn=seed_worker, generator=torch.Generator().manual_seed(seed)
        )
        return [tuple(int(v) for v in row) for batch in loader for row in zip(*batch)]

    first = rows(0)
    assert [r[0] for r in first] == list(range(6))
    assert [r[1] for r in first] == [0, 0, 0, 1, 1, 1]  # batch 0 from worker 0, batch 1 from worker 1
    assert rows(0) == first, "a seeded generator makes the workers' random draws repeat"
    assert rows(1) != first
    with pytest.raises(IndexError):
        ds[6]
    with pytest.raises(RuntimeError, match="inside a DataLoader worker"):
        seed_worker(0)


def test_fake_source_is_not_confused_with_real(tmp_path):
    # copying the real MD5 list next to fake data must fail the MD5 check, not pass silently
    src = tmp_path / "mnist"
    _make_fake_source(src)
    shutil.copy(MNIST_SOURCE_DIR / MD5_LIST, src / MD5_LIST)
    with pytest.raises(DataFileError, match="MD5"):
        prepare_mnist(src, tmp_path / "root")
