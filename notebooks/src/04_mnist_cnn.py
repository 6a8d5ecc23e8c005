# %% [markdown]
# # 04 · MNIST and convolutional networks (卷积神经网络): data pipeline, training loop, GPU, TensorBoard
#
# **What you learn.** The whole path from raw files to a trained and inspected **convolutional neural network**
# (卷积神经网络, CNN), following the notes' MNIST example, their `Net` and `CNNnet` models and their "use the GPU" section:
#
# 1. where the data comes from (the files shipped in `data/`, checked by MD5) and `torchvision.datasets.MNIST`;
# 2. the data API: a custom **dataset** (数据集, a `Dataset`), every argument of the **data loader**
#    (数据加载器, `DataLoader`), the built-in **samplers** (采样器) and a custom batch sampler, worker processes,
#    and `transforms.v2`;
# 3. why holding MNIST as tensors is much faster than decoding one PIL image at a time;
# 4. what a convolution computes (kernel, stride, padding, channels, pooling, the output-size formula), then
#    the notes' models, their shapes predicted by the formula and printed with forward hooks, and the notes' bug of a `softmax` before
#    `CrossEntropyLoss`;
# 5. one training step written out by hand, then the training loop itself: epochs, `train()`/`eval()`,
#    `torch.no_grad()`, a validation split watched during training and a test set used once: a lean CNN reaches
#    **at least 99.0% test accuracy** in one epoch with a one-cycle schedule;
# 6. curves, a confusion matrix (混淆矩阵), the misclassified digits, and TensorBoard.
#
# **Before this notebook.** Notebooks 01–03: tensors, autograd, `nn.Module`, optimizers, and hooks.
#
# **Study time:** about 95 min. Of the time its cells take to run, about a third is training the course
# model (one epoch).
#
# **On a GPU.** `get_device()` picks CUDA when it is present: the data set is then copied to GPU memory once
# (about 180 MiB) and the model trains there; the per-sample `DataLoader` uses pinned memory with
# `non_blocking` copies. Nothing in the notebook names a device; the stored outputs were made on the CPU.

# %% [markdown]
# ## Setup
#
# `seed_everything(0)` seeds Python, NumPy and torch. The test harness starts each notebook kernel with one
# thread (`OMP_NUM_THREADS=1`) so that two notebooks can run side by side on two cores; section 13 explains why
# the training run keeps that single thread.

# %%
import itertools
import pickle
import shutil
import subprocess
import sys
import time
from collections import OrderedDict

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from torch.utils.tensorboard import SummaryWriter
from torchvision.transforms import v2
from torchvision.utils import make_grid

from utils import (
    REPO_ROOT,
    get_device,
    plot_curves,
    plot_image_grid,
    plot_matrix,
    relpath,
    seed_everything,
    show_warning,
)
from utils.data import (
    MNIST_MEAN,
    MNIST_SOURCE_DIR,
    MNIST_STD,
    NegatedPairs,
    WorkerTagged,
    load_mnist,
    mnist_tensors,
    prepare_mnist,
    seed_worker,
    tensor_loader,
)
from utils.tb import read_events

seed_everything(0)
device = get_device()
RUN_DIR = REPO_ROOT / "runs" / "04_mnist_cnn"
shutil.rmtree(RUN_DIR, ignore_errors=True)  # every run starts from an empty folder
RUN_DIR.mkdir(parents=True)
print("device:", device.type, "| outputs go to", relpath(RUN_DIR))  # the thread count is printed with the timings (§13)

# %% [markdown]
# ## 1. The data: MNIST shipped with the course
#
# MNIST is 70000 grey-scale 28×28 images of handwritten digits (60000 for training, 10000 for testing) by
# Yann LeCun, Corinna Cortes and Christopher J.C. Burges (CC BY-SA 3.0, see `data/README.md`). The notes create
# it with `torchvision.datasets.MNIST(root='./data', download=True)`, which fetches four files from the internet
# the first time. A course should not depend on a web server at run time, so the four gzip files are in
# `data/mnist/` together with `MD5SUMS.raw`, the MD5 checksums of the decompressed files.
#
# `prepare_mnist()` (in `utils/data.py`) decompresses them once into `data/MNIST/raw/`, the layout torchvision
# expects, and checks every MD5; `load_mnist()` then returns the ordinary `torchvision.datasets.MNIST` object,
# built with `download=False`.

# %%
raw_dir = prepare_mnist()
print("shipped:", relpath(MNIST_SOURCE_DIR), sorted(p.name for p in MNIST_SOURCE_DIR.iterdir()))
print("decompressed into:", relpath(raw_dir))
for p in sorted(raw_dir.glob("*-ubyte")):
    print(f"  {p.name:26} {p.stat().st_size:>10,} bytes")

train_set = load_mnist(train=True)
test_set = load_mnist(train=False)
print(type(train_set).__module__ + "." + type(train_set).__name__, "| train:", len(train_set), "| test:", len(test_set))
print("data:", tuple(train_set.data.shape), train_set.data.dtype, "| targets:", train_set.targets[:10].tolist())
print("images per digit (train):", torch.bincount(train_set.targets).tolist())
assert len(train_set) == 60000 and len(test_set) == 10000

# %% [markdown]
# A `Dataset` is indexable: `train_set[i]` is an `(image, label)` pair. Without a transform, torchvision's
# MNIST returns a PIL image (the input format of torchvision's classic image transforms).

# %%
img, label = train_set[0]
print(type(img).__name__, img.mode, img.size, "label", label)
assert img.size == (28, 28) and label == 5

# %% [markdown]
# A damaged copy must fail loudly, naming the file and the fix, instead of training on garbage. Here are a
# missing file and a truncated one, in a scratch folder under `runs/` (the unit tests in `tests/test_data.py`
# also cover a file whose contents fail the MD5 check).

# %%
broken = RUN_DIR / "broken_mnist"
broken.mkdir()
shutil.copy(MNIST_SOURCE_DIR / "MD5SUMS.raw", broken)
try:
    prepare_mnist(source_dir=broken, root=broken / "root")
except FileNotFoundError as err:
    print(type(err).__name__, "->", err)

gz = MNIST_SOURCE_DIR / "train-images-idx3-ubyte.gz"
(broken / gz.name).write_bytes(gz.read_bytes()[:100_000])  # the first 100 kB of a 9.7 MB file
try:
    prepare_mnist(source_dir=broken, root=broken / "root")
except RuntimeError as err:
    print(type(err).__name__, "->", err)

# %% [markdown]
# ## 2. A `Dataset` of your own: `__len__` and `__getitem__`
#
# A map-style dataset is any object with `__len__` (how many samples) and `__getitem__(i)` (sample `i`).
# `DataLoader` asks it for indices, groups the samples into **batches** (批量) with a `collate_fn`, and turns NumPy
# arrays into tensors. The notes' example dataset returns `[-2i, -2i]` for index `i`.
#
# Note the two lengths: `len(dataset)` counts samples, `len(loader)` counts batches (steps).


# %%
class MyDataset(Dataset):  # the notes' example
    def __init__(self, length):
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, idx):
        return np.array([-idx * 2, -idx * 2])


ds = MyDataset(10)
print("ds[3] =", ds[3], "| len(ds) =", len(ds))
first = next(iter(DataLoader(ds)))  # batch_size=1 by default
print("first batch with the defaults:", first, first.dtype)
for bs, drop in ((4, False), (4, True)):
    loader = DataLoader(ds, batch_size=bs, drop_last=drop)
    print(f"batch_size={bs} drop_last={drop}: len(loader)={len(loader)}, batch sizes {[len(b) for b in loader]}")
assert len(DataLoader(ds, batch_size=4)) == 3 and len(DataLoader(ds, batch_size=4, drop_last=True)) == 2

# %% [markdown]
# The notes then pass their own `batch_sampler` and `collate_fn`. Running their code shows two things the notes
# get wrong:
#
# * the notes say `collate_fn` receives *a list of indices*; it receives **the list of samples**
#   (`dataset[i]` for each index of the batch) and returns the batch;
# * `MySampler(20)` yields index pairs up to `[19, 20]` for a dataset of 10 items, and nothing complains,
#   because the notes' `__getitem__` never checks its index: the loader happily returns 20 batches, the last
#   ones made of samples that do not exist. Without `__len__`, `len(loader)` also fails.


# %%
class MySampler(Sampler):  # the notes' batch sampler: yields a list of indices per batch
    def __init__(self, batch_nums):
        self.batch_nums = batch_nums

    def __iter__(self):
        for i in range(self.batch_nums):
            yield [i, i + 1]


def collect(samples):
    print("  collate_fn received:", [s.tolist() for s in samples])
    return samples


for _batch in DataLoader(ds, batch_sampler=MySampler(2), collate_fn=collect):
    pass
batches = list(DataLoader(ds, batch_sampler=MySampler(20), collate_fn=lambda s: s))
print("batches from a 10-item dataset:", len(batches), "| last batch:", [b.tolist() for b in batches[-1]])
try:
    len(DataLoader(ds, batch_sampler=MySampler(20)))
except TypeError as err:
    print(type(err).__name__, "->", err)
assert len(batches) == 20 and batches[-1][1].tolist() == [-40, -40]  # "sample 20" of a 10-item dataset

# %% [markdown]
# The fix: the dataset checks its index (like a list, it raises `IndexError`), and the batch sampler knows
# its length and stays inside the data. `NegatedPairs` in `utils/data.py` is the notes' dataset with the check.


# %%
class PairSampler(Sampler[list[int]]):
    """Batches of two consecutive indices, [0, 1], [2, 3], ...: a custom batch sampler done right."""

    def __init__(self, n_items: int):
        self.n_items = n_items

    def __iter__(self):
        for i in range(0, self.n_items - 1, 2):
            yield [i, i + 1]

    def __len__(self):
        return self.n_items // 2


fixed = DataLoader(NegatedPairs(10), batch_sampler=PairSampler(10))
print("len:", len(fixed), "| batches:", [b[:, 0].tolist() for b in fixed])
try:
    NegatedPairs(10)[10]
except IndexError as err:
    print(type(err).__name__, "->", err)
assert len(fixed) == len(list(fixed)) == 5

# %% [markdown]
# ## 3. `DataLoader` arguments
#
# | argument | what it does |
# |---|---|
# | `batch_size`, `drop_last` | samples per batch; drop the last, smaller batch |
# | `shuffle` | a new random order every epoch (a `RandomSampler` under the hood) |
# | `sampler` | your own order of *single* indices; excludes `shuffle` |
# | `batch_sampler` | yields whole *lists* of indices; excludes `batch_size`, `shuffle`, `sampler`, `drop_last` |
# | `collate_fn` | turns the list of samples into a batch (default: stack and convert to tensors) |
# | `num_workers` | load batches in that many worker processes (0: in the main process) |
# | `worker_init_fn` | called in each worker with its id, after seeding, before loading |
# | `generator` | the random generator for shuffling and for the workers' seeds: reproducible runs |
# | `pin_memory` | put batches in **pinned memory** (固定内存: page-locked host memory) for fast, asynchronous copies to a GPU |
# | `timeout`, `prefetch_factor`, `persistent_workers` | waiting for workers; batches loaded ahead; keep workers between epochs |
#
# The exclusions are checked when the loader is built:

# %%
for kwargs in (dict(shuffle=True, sampler=SequentialSampler(ds)), dict(batch_size=4, batch_sampler=PairSampler(10))):
    try:
        DataLoader(ds, **kwargs)
    except ValueError as err:
        print(f"{sorted(kwargs)}: {type(err).__name__} -> {err}")
print(
    "shuffle=True uses a",
    type(DataLoader(ds, shuffle=True).sampler).__name__,
    "| shuffle=False uses a",
    type(DataLoader(ds).sampler).__name__,
)
assert isinstance(DataLoader(ds, shuffle=True).sampler, RandomSampler)

# %% [markdown]
# A seeded `generator` makes the shuffled order repeatable without touching the global random state.
# `collate_fn` is where batches of samples of different sizes are made rectangular, for example by padding
# variable-length sequences and returning their lengths:


# %%
def epoch_order(seed):
    loader = DataLoader(range(10), batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(seed))
    return [b.tolist() for b in loader]


rng_before = torch.get_rng_state()
print("seed 0:", epoch_order(0), "| again:", epoch_order(0), "| seed 1:", epoch_order(1))
assert epoch_order(0) == epoch_order(0) != epoch_order(1)
assert torch.equal(rng_before, torch.get_rng_state()), "the global generator was not used"
shuffled = DataLoader(range(10), batch_size=10, shuffle=True, generator=torch.Generator().manual_seed(0))
epoch1, epoch2 = [next(iter(shuffled)).tolist() for _ in range(2)]
print("one loader, two epochs:", epoch1, epoch2)
assert epoch1 != epoch2 and sorted(epoch1) == sorted(epoch2) == list(range(10))


def pad_collate(samples):
    seqs = [torch.tensor(s) for s in samples]
    return nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=-1), torch.tensor([len(s) for s in seqs])


sentences = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10]]  # a list is a Dataset too: it has __len__ and __getitem__
padded, lengths = next(iter(DataLoader(sentences, batch_size=4, collate_fn=pad_collate)))
print(padded.tolist(), "lengths", lengths.tolist())
assert padded.shape == (4, 4) and lengths.tolist() == [3, 1, 2, 4]

# %% [markdown]
# ## 4. Samplers
#
# A sampler decides which indices are read, in which order. The built-in ones:
#
# * `SequentialSampler(ds)`: 0, 1, 2, … (what `shuffle=False` uses);
# * `RandomSampler(ds, replacement=False, num_samples=None)`: a permutation, or draws with replacement;
# * `SubsetRandomSampler(indices)`: a random order of *the given indices only*. The notes call it a lazy
#   `RandomSampler` that shuffles the whole set; its real use is to read a subset, e.g. a validation split;
# * `WeightedRandomSampler(weights, num_samples, replacement=True)`: index `i` is drawn with probability
#   proportional to `weights[i]`, e.g. to balance rare classes;
# * `BatchSampler(sampler, batch_size, drop_last)`: groups any sampler's indices into lists.

# %%
g = torch.Generator().manual_seed(0)
print("Sequential       :", list(SequentialSampler(range(8))))
print("Random           :", list(RandomSampler(range(8), generator=g)))
print("Random, replaced :", list(RandomSampler(range(8), replacement=True, num_samples=10, generator=g)))
split = torch.randperm(10, generator=g).tolist()
train_idx, val_idx = split[:7], split[7:]
print("SubsetRandom(val):", list(SubsetRandomSampler(val_idx, generator=g)), "of", sorted(val_idx))
print("Batch            :", list(BatchSampler(SequentialSampler(range(8)), batch_size=3, drop_last=False)))
assert sorted(SubsetRandomSampler(val_idx, generator=g)) == sorted(val_idx) and not set(train_idx) & set(val_idx)

# %% [markdown]
# `WeightedRandomSampler` on an imbalanced set: 900 samples of class 0 and 100 of class 1. Giving each sample
# the weight `1 / (size of its class)` makes both classes about equally likely.

# %%
labels = torch.tensor([0] * 900 + [1] * 100)
weights = 1.0 / torch.bincount(labels)[labels].double()
sampler = WeightedRandomSampler(weights, num_samples=1000, replacement=True, generator=torch.Generator().manual_seed(0))
drawn = torch.bincount(labels[list(sampler)])
print("class counts in the data:", torch.bincount(labels).tolist(), "| drawn by the sampler:", drawn.tolist())
assert abs(drawn[0].item() - 500) < 60

# %% [markdown]
# ## 5. Worker processes (`num_workers > 0`)
#
# With `num_workers=2`, two worker processes each load whole batches (batch 0 from worker 0, batch 1 from
# worker 1, …) while the main process trains. Each worker gets **its own copy of the dataset**. How that copy
# is made depends on the start method of Python's `multiprocessing`:
#
# * `fork` (the default on Linux up to Python 3.13) copies the whole running process, classes included;
# * `spawn` (the default on macOS and Windows) and `forkserver` (Linux from Python 3.14) start a fresh Python
#   interpreter and send it the dataset with `pickle`. Pickle stores a class by **module and name only**, and
#   the fresh process must import it. A class defined in a notebook lives in the kernel's `__main__`, which the
#   worker does not have: the worker dies with `AttributeError: Can't get attribute ...`.
#
# That is why the datasets (and the `worker_init_fn`) this course uses with workers live in `utils/data.py`.
# The same failure, reproduced in a fresh interpreter without starting any worker:

# %%
for obj in (MyDataset(3), NegatedPairs(3)):
    blob = pickle.dumps(obj)
    print(
        f"{type(obj).__name__:12} is pickled as a reference to module",
        "'__main__'" if b"__main__" in blob else "'utils.data'" if b"utils.data" in blob else "?",
    )
fresh = subprocess.run(
    [sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
    input=pickle.dumps(MyDataset(3)),
    capture_output=True,
)
print("a fresh interpreter says:", fresh.stderr.decode().strip().splitlines()[-1].split(" on <module")[0])
assert fresh.returncode != 0 and b"Can't get attribute 'MyDataset'" in fresh.stderr
print("this kernel starts workers with:", torch.multiprocessing.get_start_method())

# %% [markdown]
# Workers are seeded: each epoch the loader draws a base seed (from its `generator` if given); worker `k`
# seeds torch and `random` with `base_seed + k` and NumPy with a value derived from the two. So a seeded
# generator makes even random augmentations in the workers repeat. `WorkerTagged` returns, for each index, the worker that loaded it and one random draw
# from torch and from NumPy in that worker; `seed_worker` is the `worker_init_fn` recipe from PyTorch's
# reproducibility guide. The demo is tiny because starting processes costs time.


# %%
def worker_rows(seed):
    loader = DataLoader(
        WorkerTagged(8),
        batch_size=2,
        num_workers=2,
        worker_init_fn=seed_worker,
        generator=torch.Generator().manual_seed(seed),
    )
    return [tuple(int(v) for v in row) for batch in loader for row in zip(*batch)]


rows = worker_rows(0)
print("index, worker, torch draw, numpy draw")
for r in rows:
    print(" ", r)
assert [r[1] for r in rows] == [0, 0, 1, 1, 0, 0, 1, 1]
assert worker_rows(0) == rows, "the same generator seed gives the same draws in the workers"
print("same seed repeats:", worker_rows(0) == rows, "| seed 1 differs:", worker_rows(1) != rows)

# %% [markdown]
# ## 6. `transforms.v2`: from PIL image to a normalised tensor
#
# The notes use `transforms.ToTensor()` and `Normalize((0.5), (0.5))`. Today's API is `torchvision.transforms.v2`:
# `ToImage()` (PIL → uint8 tensor image) and `ToDtype(torch.float32, scale=True)` (→ floats in [0, 1]) replace
# `ToTensor`, whose v2 version is deprecated. And instead of guessing 0.5, we compute the mean and standard
# deviation of the training pixels, so that the normalised inputs have mean 0 and standard deviation 1.
# The 47 million pixels take only 256 values, so a histogram (`bincount`) gives both statistics exactly and fast.

# %%
counts = torch.bincount(train_set.data.flatten(), minlength=256).double()  # how many pixels have value 0..255
values = torch.arange(256, dtype=torch.float64) / 255
n_pixels = counts.sum()
pixel_mean = (counts * values).sum() / n_pixels
pixel_std = ((counts * (values - pixel_mean) ** 2).sum() / (n_pixels - 1)).sqrt()
mean, std = round(pixel_mean.item(), 4), round(pixel_std.item(), 4)
print(f"MNIST training pixels: {int(n_pixels):,} values, mean {mean}, std {std}")
assert (mean, std) == (MNIST_MEAN, MNIST_STD)

transform = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize([mean], [std])])
x0, y0 = load_mnist(train=True, transform=transform)[0]
print(type(x0).__name__, tuple(x0.shape), x0.dtype, f"min {x0.min():.4f} max {x0.max():.4f}")

show_warning(v2.ToTensor, UserWarning, "deprecated")  # the notes' ToTensor(): use ToImage + ToDtype
pixels = train_set.data[:1000].double() / 255
half, ours = (pixels - 0.5) / 0.5, (pixels - mean) / std
print(
    f"Normalize(0.5, 0.5): mean {half.mean():.2f}, std {half.std():.2f} | "
    f"Normalize({mean}, {std}): mean {ours.mean():.2f}, std {ours.std():.2f}"
)
assert abs(ours.mean()) < 0.05 and abs(ours.std() - 1) < 0.05 and half.mean() < -0.7

# %% [markdown]
# ## 7. Looking at a batch: `next(iter(loader))` and `make_grid`
#
# The notes take one batch with `dataiter.next()`. That worked because PyTorch's DataLoader iterator kept a
# Python 2 style `.next()` method as an alias until PyTorch 1.13 removed it (Python 3 itself had renamed the
# protocol to `__next__` long before): the built-in `next(iterator)` is the way. `torchvision.utils.make_grid` tiles a batch into one image
# (it repeats a single channel three times), and matplotlib wants channels last.

# %%
train_tf = load_mnist(train=True, transform=transform)
loader = DataLoader(train_tf, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
dataiter = iter(loader)
try:
    dataiter.next()
except AttributeError as err:
    print(type(err).__name__, "->", err)
images, labels = next(dataiter)
grid = make_grid(images * std + mean, nrow=8, padding=2)  # undo the normalisation for display
print("batch", tuple(images.shape), "-> grid", tuple(grid.shape))
print(labels.view(4, 8).tolist())
plt.figure(figsize=(6, 3.2))
plt.imshow(grid.permute(1, 2, 0).clamp(0, 1).numpy())
plt.axis("off")
plt.show()
assert grid.shape == (3, 4 * 30 + 2, 8 * 30 + 2)

# %% [markdown]
# ## 8. Per-sample pipeline or tensors in memory?
#
# The per-sample pipeline does, for every image of every epoch: index → PIL image → `ToImage` → `ToDtype` →
# `Normalize` → stack 128 of them. That is over a hundred microseconds of Python per image (measured below),
# about as long as the small CNN of section 12 needs to train on it. MNIST is tiny (60000 × 784 float32
# values, about 180 MiB), so we do the transform **once**
# for the whole set and keep two tensors, on the GPU when there is one. `mnist_tensors()` performs exactly the
# same operations as the v2 pipeline, so the numbers are bit-for-bit equal.
#
# Batches are then slices of those tensors. `tensor_loader()` is still a `DataLoader`, built with the sampler
# machinery of section 4: `batch_size=None` turns off automatic batching, and a `BatchSampler` over a
# `RandomSampler` hands the dataset a whole list of indices, so one `x[indices]` makes a batch.

# %%
x_train, y_train = mnist_tensors(train=True, device=device)
x_test, y_test = mnist_tensors(train=False, device=device)
print("x_train", tuple(x_train.shape), x_train.dtype, x_train.device.type, f"| {x_train.nbytes / 2**20:.0f} MiB")
for i in (0, 1, 59999):
    assert torch.equal(x_train[i].cpu(), train_tf[i][0].as_subclass(torch.Tensor)) and y_train[i] == train_tf[i][1]
print("equal to the v2 pipeline:", True)

fast = tensor_loader(x_train, y_train, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
fx, fy = next(iter(fast))
print(
    "same first batch as the per-sample loader above:", torch.equal(fx.cpu(), images) and torch.equal(fy.cpu(), labels)
)
assert torch.equal(fx.cpu(), images) and torch.equal(fy.cpu(), labels)


# %%
# NBVAL_IGNORE_OUTPUT
def samples_per_s(loader, n_batches):
    start, n = time.perf_counter(), 0
    for i, (xb, yb) in enumerate(loader):
        xb = xb.to(device, non_blocking=True)
        n += len(yb)
        if i + 1 == n_batches:
            break
    return n / (time.perf_counter() - start)


pil_loader = DataLoader(
    train_tf, batch_size=128, shuffle=True, pin_memory=device.type == "cuda", generator=torch.Generator().manual_seed(0)
)
slow_rate = samples_per_s(pil_loader, 20)
fast_rate = samples_per_s(tensor_loader(x_train, y_train, batch_size=128, shuffle=True), 469)
print(f"per-sample PIL pipeline: {slow_rate:9,.0f} samples/s")
print(f"tensors in memory      : {fast_rate:9,.0f} samples/s  ({fast_rate / slow_rate:.0f}x)")
assert fast_rate > 5 * slow_rate

# %% [markdown]
# ## 9. Where tensors live: CPU or GPU (使用GPU训练)
#
# The notes' GPU recipe still holds, with one correction of emphasis:
#
# * `model.to(device)` moves the module's parameters **in place** and returns the same module;
# * `tensor.to(device)` returns a **new** tensor on that device (or the same one if it is already there), so
#   write `x = x.to(device)`;
# * model and inputs must be on the same device, otherwise PyTorch raises a `RuntimeError`.
#
# Pick the device once (`get_device()`), never write `"cuda"` into the code. When the data does not fit on the
# GPU, keep it on the CPU in **pinned** (page-locked) memory, which the notes describe as "CUDA memory" but is
# host memory the GPU can copy from directly; then `x.to(device, non_blocking=True)` overlaps the copy with
# computation. `DataLoader(pin_memory=True)` does the pinning; the copy is then `xb.to(device, non_blocking=True)`.

# %%
layer = nn.Linear(4, 2)
assert layer.to(device) is layer  # modules move in place
t = torch.ones(3)
moved = t.to(device)
assert t.to(t.device) is t  # already there: the same tensor, no copy
if device.type != "cpu":
    assert moved is not t and t.device.type == "cpu"  # a copy; t itself did not move
print(f"layer.to(device) is layer: {layer.to(device) is layer} | t.to(device) left t on {t.device.type}")
try:
    nn.Linear(4, 2)(torch.ones(1, 4, device="meta"))  # "meta": a device without data, handy to show the error
except RuntimeError as err:
    print(type(err).__name__, "->", err)
if device.type == "cuda":
    pinned = torch.ones(1024).pin_memory()
    assert pinned.is_pinned() and pinned.to(device, non_blocking=True).device.type == "cuda"
    print("pinned host memory + non_blocking copy: done")
else:
    print("pinned host memory + non_blocking copy: only useful with a CUDA device (this run uses the CPU)")

# %% [markdown]
# ## 10. The notes' models, layer by layer with forward hooks
#
# ### First, what a convolution computes
#
# A 2-D convolution slides a small **convolution kernel (卷积核)**, e.g. 3×3 numbers, over the image; at each
# position it multiplies the kernel with the patch under it, element by element, and sums: one output number per
# position. (Deep learning's "convolution" does not flip the kernel: it is a cross-correlation.) Four settings
# decide the output size:
#
# * **kernel size** $k$; **stride (步长)** $s$, how far the kernel moves per step; **padding** $p$, zeros added
#   around the border; for an input of size $n$ the output has
#   $$\left\lfloor \frac{n + 2p - k}{s} \right\rfloor + 1$$
#   positions per side (a 3×3 kernel with stride 1 and no padding turns 28 into 26).
# * **channels**: a `Conv2d(c_in, c_out, k)` has `c_out` kernels, each of shape `c_in × k × k`; each output channel
#   sums over all input channels. Its parameters are $c_{out} \cdot c_{in} \cdot k^2$ weights plus $c_{out}$ biases.
# * **weight sharing**: the same kernel is used at every position, so the parameter count does not depend on the
#   image size, and a pattern is detected wherever it appears.
# * **pooling (池化)**: `MaxPool2d(2)` keeps the largest value of each 2×2 block (kernel 2, stride 2: the same
#   formula halves 26 to 13, rounding down 11 to 5).

# %%
image = torch.arange(25.0).view(1, 1, 5, 5)
kernel = torch.tensor([[[[1.0, 0.0, -1.0]] * 3]])  # 3x3, responds to left-right changes
out = F.conv2d(image, kernel)
by_hand = torch.tensor([[(image[0, 0, i : i + 3, j : j + 3] * kernel[0, 0]).sum() for j in range(3)] for i in range(3)])
print("input 5x5 -> output", tuple(out.shape[-2:]), "| by hand:", by_hand.tolist())
assert torch.equal(out[0, 0], by_hand)


def conv_out(n, k, s=1, p=0):
    """Output size of a convolution or pooling along one side."""
    return (n + 2 * p - k) // s + 1


for k, s_, p_ in [(3, 1, 0), (3, 1, 1), (3, 2, 1), (2, 2, 0)]:
    got = F.conv2d(torch.zeros(1, 1, 28, 28), torch.zeros(1, 1, k, k), stride=s_, padding=p_).shape[-1]
    print(f"n=28, k={k}, s={s_}, p={p_}: formula {conv_out(28, k, s_, p_)}, conv2d gives {got}")
    assert got == conv_out(28, k, s_, p_)
conv = nn.Conv2d(1, 32, 3)
print("Conv2d(1, 32, 3) parameters:", sum(q.numel() for q in conv.parameters()), "= 32*1*3*3 + 32, for any image size")
assert sum(q.numel() for q in conv.parameters()) == 32 * 1 * 3 * 3 + 32

# Predicting the notes' models before running them (the hooks below check):
# Net:    28 -conv3-> 26 -pool-> 13 -conv3-> 11 -pool-> 5 -conv3-> 3, with 64 channels
# CNNnet: 28 -conv3-> 26 -conv3-> 24 -pool-> 12, with 64 channels
side_net = conv_out(conv_out(conv_out(conv_out(conv_out(28, 3), 2, 2), 3), 2, 2), 3)
side_cnn = conv_out(conv_out(conv_out(28, 3), 3), 2, 2)
predicted = {"Net flatten": 64 * side_net**2, "CNNnet flatten": 64 * side_cnn**2}
print("predicted flattened sizes:", predicted)
assert predicted == {"Net flatten": 576, "CNNnet flatten": 9216}

fig, axes = plt.subplots(1, 3, figsize=(9, 3))
for ax, (k, s_, p_) in zip(axes, [(3, 1, 0), (3, 1, 1), (3, 2, 1)]):
    n = 5 + 2 * p_
    for i in range(n):
        for j in range(n):
            pad = not (p_ <= i < n - p_ and p_ <= j < n - p_)
            ax.add_patch(plt.Rectangle((j, n - 1 - i), 1, 1, fill=True, fc="#eeeeee" if pad else "white", ec="gray"))
    for start, colour in ((0, "C0"), (s_, "C1")):  # the first two positions of the kernel
        ax.add_patch(plt.Rectangle((start, n - k), k, k, fill=False, ec=colour, lw=2.5))
    ax.set_title(f"k={k}, s={s_}, p={p_}: 5 -> {conv_out(5, k, s_, p_)}", fontsize=10)
    ax.set(xlim=(-0.2, n + 0.2), ylim=(-0.2, n + 0.2), aspect="equal")
    ax.axis("off")
fig.suptitle("A 3x3 kernel on a 5x5 input: first two positions (blue, orange); grey cells are padding", fontsize=10)
plt.show()

# %% [markdown]
# ### The notes' models
#
# The notes' `CNNnet` has a `print(x.shape)` after every line of `forward`: it clutters every later call and
# has to be deleted again. A **forward hook** (notebook 03) does the same from outside, on any model, and is
# removed afterwards. Hooks see modules, so `F.relu` and `F.max_pool2d` calls do not appear; their effect
# shows in the next layer's shape.


# %%
class Net(nn.Module):  # the notes' MNIST model; `softmax=True` is the notes' (wrong) output, see section 11
    def __init__(self, softmax=True):
        super().__init__()  # Python 3: no need for super(Net, self)
        self.softmax = softmax
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.conv3 = nn.Conv2d(64, 64, 3, 1)
        self.pool = nn.MaxPool2d(2, 2)
        self.dense1 = nn.Linear(576, 64)
        self.dense2 = nn.Linear(64, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = self.conv3(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.dense1(x))
        x = self.dense2(x)
        return F.softmax(x, dim=1) if self.softmax else x


class CNNnet(nn.Module):  # the notes' second model, without the prints
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout2d(0.25)
        self.dropout2 = nn.Dropout(0.5)  # the notes use Dropout2d here, on a flat [N, 128] tensor: see below
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return self.fc2(x)  # logits


def shape_report(model, x):
    """Print each named leaf module's output shape (via forward hooks) and the parameter count."""
    handles = []
    for name, module in model.named_modules():
        if name and not list(module.children()):
            handles.append(
                module.register_forward_hook(
                    lambda mod, inp, out, name=name: print(f"  {name:18} {type(mod).__name__:12} -> {list(out.shape)}")
                )
            )
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        for h in handles:
            h.remove()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"  {type(model).__name__}: {n_params:,} parameters")
    return out, n_params


random_data = torch.rand(100, 1, 28, 28)  # the notes' input: [N, C, H, W] = 100 grey 28x28 images
net, cnn = Net().eval(), CNNnet().eval()
print("Net:")
_, n_net = shape_report(net, random_data)
print("CNNnet:")
out, n_cnn = shape_report(cnn, random_data)
assert out.shape == (100, 10) and (n_net, n_cnn) == (93_322, 1_199_882) and n_cnn / n_net > 12.8
assert (net.dense1.in_features, cnn.fc1.in_features) == (predicted["Net flatten"], predicted["CNNnet flatten"])
assert not any(m._forward_hooks for m in [*net.modules(), *cnn.modules()]), "the hooks were removed"

# %% [markdown]
# Two smaller slips in the notes' `CNNnet`: the comment after `dropout2` says `[100, 10]` but the shape there
# is `[100, 128]` (the hook output above shows it); and `nn.Dropout2d` on that flat `[N, 128]` tensor is
# deprecated. A **dropout** (丢弃法) layer zeroes random values during training (section 13); `Dropout2d` zeroes whole
# *channels* of a `[N, C, H, W]` feature map; on a flat vector use
# `nn.Dropout`. Note also where `CNNnet`'s 1.2 million parameters are: 98% of them in `fc1` (9216 × 128),
# because it flattens a large 12×12×64 map. `Net` pools more and needs 13 times fewer.

# %%
show_warning(lambda: nn.Dropout2d(0.5)(torch.ones(100, 128)), UserWarning, "2-D input to dropout2d")
maps = nn.Dropout2d(0.5)(torch.ones(4, 8, 5, 5))  # training mode: whole channels are zeroed (the rest scaled x2)
per_channel = maps.flatten(2)
whole_channels = bool(((per_channel == 0).all(2) | (per_channel == 2).all(2)).all())
zeroed = int((per_channel == 0).all(2).sum())
print(f"Dropout2d on [4, 8, 5, 5]: {zeroed} of 32 channels zeroed whole, every other value doubled")
assert whole_channels
print(
    "fc1 holds",
    f"{CNNnet().fc1.weight.numel() / n_cnn:.0%}",
    "of CNNnet's parameters; Net has",
    f"{n_cnn / n_net:.0f} times fewer",
)

# %% [markdown]
# ## 11. The notes' bug: `softmax` before `CrossEntropyLoss`
#
# `nn.CrossEntropyLoss`, the **cross-entropy** (交叉熵) loss, expects raw scores, **logits** (未归一化的对数几率): it
# applies `log_softmax` itself and then takes the
# negative log-probability of the right class (`nll_loss`). The notes' `Net` returns `softmax(x)`, so the loss
# applies a second softmax to numbers in [0, 1]. Two consequences:
#
# * the loss can never get small: even a perfect one-hot output `[1, 0, …, 0]` has a loss of
#   $\log(1 + 9/e) \approx 1.46$;
# * gradients are squashed twice, so learning is slow.
#
# Return logits from `forward`; apply `softmax` only when you want probabilities, for display.

# %%
logits = torch.randn(5, 10)
targets = torch.randint(0, 10, (5,))
assert torch.allclose(F.cross_entropy(logits, targets), F.nll_loss(F.log_softmax(logits, dim=1), targets))
perfect = F.one_hot(torch.tensor([3]), 10).float()  # the best a softmax output can ever be
floor = F.cross_entropy(perfect, torch.tensor([3])).item()
print(f"loss floor after a softmax: {floor:.4f} = log(1 + 9/e)")
assert abs(floor - np.log(1 + 9 / np.e)) < 1e-6

# %% [markdown]
# To see the slower training cheaply: the same `Net`, the same initial weights and the same 60 batches of 32
# training images, with and without the final softmax (SGD with momentum, as in the notes, but a larger step).


# %%
def short_run(softmax, steps=60, batch_size=32):
    torch.manual_seed(0)
    model = Net(softmax=softmax).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(steps):
        idx = torch.randint(0, len(x_train), (batch_size,), generator=g).to(device)
        loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():  # accuracy on 2,000 test images (section 13 explains eval() and no_grad())
        acc = (model(x_test[:2000]).argmax(dim=1) == y_test[:2000]).float().mean().item()
    return losses, acc


losses_sm, acc_sm = short_run(softmax=True)
losses_lg, acc_lg = short_run(softmax=False)
fig = plot_curves(
    {"softmax + CrossEntropyLoss (notes)": losses_sm, "logits + CrossEntropyLoss": losses_lg},
    xlabel="step",
    ylabel="training loss",
    title="Net, 60 steps of 32 images",
)
plt.show()
late_sm, late_lg = np.mean(losses_sm[-20:]), np.mean(losses_lg[-20:])
print(f"softmax: last-20-step loss above 2.0: {late_sm > 2.0}, test accuracy below 60%: {acc_sm < 0.6}")
print(f"logits : last-20-step loss below 1.2: {late_lg < 1.2}, test accuracy above 70%: {acc_lg > 0.7}")
assert late_sm > 2.0 and late_lg < 1.2 and acc_lg > acc_sm + 0.2

# %% [markdown]
# ## 12. The course model and one training step by hand
#
# The course model is a lean CNN in the spirit of `Net`, built to train fast on a CPU:
#
# * three 3×3 convolutions with 16, 32 and 64 channels, each followed by **batch normalisation**
#   (批归一化, `BatchNorm2d`), which keeps activations well scaled and allows a large **learning rate** (学习率);
# * max-pooling (池化) *before* BatchNorm and ReLU, so those run on maps four times smaller. Pooling and ReLU
#   commute (ReLU never changes which value is largest), but pooling and BatchNorm do **not**: BatchNorm computes
#   its statistics over the values it is given (the pooled maps here, not the full ones), and a negative scale
#   $\gamma$ turns maxima into minima. So this is a different model from conv → BN → ReLU → pool, chosen for speed,
#   not an equivalent rewrite (both are checked below). The convolutions have no bias because BatchNorm adds its own;
# * a single linear layer that returns **logits**. 29 178 parameters, a third of `Net`'s;
# * the **channels-last** memory format (`model.to(memory_format=torch.channels_last)`): feature maps are
#   stored as `[N, H, W, C]` in memory (the shape stays `[N, C, H, W]`), which the CPU's vectorised
#   convolution and pooling kernels prefer. On the course machine, with one thread and oneDNN held to its AVX2
#   kernels, a training step took less CPU time that way (measured after the training run below); on the same Intel
#   CPU with two threads and oneDNN free to use its AVX-512 and AMX kernels, channels-first was as fast or faster
#   in one of our runs. Which layout wins depends on the CPU and the library's kernels: measure on yours. The input
#   has one channel, so it needs no conversion.
#
# One training step is five lines: clear the old gradients, forward, loss, backward, update.


# %%
def conv_block(c_in, c_out, pool=True):
    layers = [nn.Conv2d(c_in, c_out, 3, bias=False)] + ([nn.MaxPool2d(2)] if pool else [])
    return nn.Sequential(*layers, nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


def course_model():
    model = nn.Sequential(
        OrderedDict(
            block1=conv_block(1, 16),  # 28 -> 26 -> 13
            block2=conv_block(16, 32),  # 13 -> 11 -> 5
            block3=conv_block(32, 64, pool=False),  # 5 -> 3
            flatten=nn.Flatten(),
            head=nn.Linear(64 * 3 * 3, 10),  # logits
        )
    )
    return model.to(memory_format=torch.channels_last)


z = torch.randn(2, 3, 6, 6)
assert torch.equal(F.max_pool2d(F.relu(z), 2), F.relu(F.max_pool2d(z, 2)))  # pooling and ReLU commute
bn = nn.BatchNorm2d(3)  # train mode: normalises with the statistics of the batch it is given
gap = (bn(F.max_pool2d(z, 2)) - F.max_pool2d(bn(z), 2)).abs().max().item()
print(f"pool then BatchNorm vs BatchNorm then pool: largest difference {gap:.1f}")
assert gap > 0.1  # BatchNorm and pooling do not commute
torch.manual_seed(0)
model = course_model().to(device)
_, n_course = shape_report(model.eval(), x_train[:100])
model.train()
loss_fn = nn.CrossEntropyLoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
xb, yb = x_train[:128], y_train[:128]
losses = []
for _ in range(3):
    optimizer.zero_grad()  # 1. forget the previous gradients (they accumulate)
    outputs = model(xb)  # 2. forward: logits [128, 10]
    loss = loss_fn(outputs, yb)  # 3. one number to minimise
    loss.backward()  # 4. gradients of the loss with respect to every parameter
    optimizer.step()  # 5. update the parameters
    losses.append(loss.item())
print("loss of three steps on the same batch:", [f"{v:.1f}" for v in losses])
assert n_course == 29_178 and losses[0] > losses[1] > losses[2]
assert model.block1[0].weight.is_contiguous(memory_format=torch.channels_last)

# %% [markdown]
# ## 13. The training loop, written out
#
# A training run repeats the five-line step over the whole **training set** (训练集), once per **epoch (轮次)**, and after each
# epoch measures the model on data it does not train on. Three pieces appear here for the first time:
#
# * A **validation set** (验证集). The **test set** (测试集) must be used *once*, at the end, for the accuracy we report: if we
#   looked at it after every epoch to choose the number of epochs or the learning rate, the reported number would
#   be tuned to it and no longer an honest estimate. So we hold out 5,000 of the 60,000 training images (a seeded
#   random split) to watch during training, and train on the other 55,000.
# * **`model.train()` and `model.eval()`.** They set a flag that a few layers read. This model has
#   `BatchNorm2d` (批归一化): in train mode it normalises with the mean and variance of the current batch and
#   updates its running averages; in eval mode it uses those running averages, so a prediction does not depend
#   on the other images in the batch. `Dropout` (丢弃法, the notes' `CNNnet` has two) zeroes a random fraction
#   $p$ of the values in train mode and scales the rest by $1/(1-p)$; in eval mode it does nothing. Forgetting
#   `eval()` gives noisy, batch-dependent predictions; forgetting `train()` afterwards trains without them.
# * **`torch.no_grad()`** around evaluation: no graph is recorded, which saves memory and time. It does not switch
#   the layers' mode: `eval()` and `no_grad()` are independent, and evaluation needs both.
#
# First the two modes, checked:

# %%
torch.manual_seed(0)
layers = nn.Sequential(nn.BatchNorm1d(4), nn.Dropout(0.5))
batch = torch.randn(8, 4) * 3 + 5
layers.train()
out_train = layers(batch)
running_mean = layers[0].running_mean.clone()
layers.eval()
out_eval = layers(batch)
print(
    f"train mode: {int((out_train == 0).sum())} of 32 values dropped; running mean moved from 0 to {running_mean.mean():.1f}"
)
print(
    f"eval mode:  {int((out_eval == 0).sum())} dropped; output for image 0 alone equals its output in the batch:",
    torch.allclose(layers(batch[:1]), out_eval[:1]),
)
assert (out_train == 0).sum() > 0 and (out_eval == 0).sum() == 0
assert torch.equal(layers[0].running_mean, running_mean)  # eval mode leaves the running averages alone
assert torch.allclose(layers(batch[:1]), out_eval[:1])

# %% [markdown]
# The recipe, against the notes' (batch 4, SGD lr 0.001, three epochs over 60,000 images):
#
# * **batch 128** from the tensors in memory: 430 steps per epoch instead of 15,000;
# * **AdamW** with a **one-cycle schedule** (`OneCycleLR`): the learning rate (学习率) warms up to 0.02 over the
#   first 30% of the steps, then anneals to almost zero. It is stepped after every batch. (To read the current
#   rate use `scheduler.get_last_lr()`; the notes' `get_lr()` is internal and warns.) `fused=True` updates all
#   parameters in one kernel instead of a loop of small operations per parameter tensor. `betas=(0.9, 0.99)`
#   shortens the memory of Adam's average of squared gradients from about 1000 steps to about 100, which suits
#   a run of a few hundred steps;
# * **one epoch**, with the validation set measured four times during it (every 108 steps), so the curves have
#   more than one point;
# * the loss is cross-entropy on the logits, with **label smoothing (标签平滑)**
#   (`CrossEntropyLoss(label_smoothing=0.1)`): the target puts 0.91 on the true digit and 0.01 on each of the nine
#   others instead of 1 and 0, so the model is not pushed towards ever larger logits on images it already gets
#   right. The loss can then no longer reach 0: its floor is the entropy of that target, about 0.50 (computed below).
#
# The two functions below are the whole loop. `train_steps` trains on the batches it is given (here a quarter of
# an epoch at a time) and accumulates the loss and the number of correct predictions (weighting each batch's mean
# loss by its size, since the last batch is smaller); it also keeps every step's loss for the curves; `evaluate`
# does the same in eval mode without gradients.
# (`loss.item()` copies one number to the CPU each step; on a GPU that waits for the forward pass to finish, which
# costs little at this size.)
#
# Two checks are good practice in any loop. Both functions stop at the first batch whose loss is NaN or infinite,
# name it, and say what is to blame, its input or the model: in training, before `backward()` writes the NaN into
# every gradient (the forward pass has already added the batch to BatchNorm's running averages, which hold NaN from
# then on: rebuild the model), and in evaluation because NaN logits still have an `argmax`, so an accuracy would
# come out of them. And `train_steps` refuses an optimizer that holds parameters of another model — what you get by
# re-running the cell that builds the model but not the one that builds the optimizer: training then runs without
# an error while the new model's weights never change.

# %% tags=["shared"]
import math

import torch
from torch import nn

loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)  # label smoothing: see the recipe above


def check_finite(loss, xb, model, where):
    """Stop at the first NaN or infinite loss, and say what is to blame: the batch's input, or the model."""
    if math.isfinite(loss):
        return
    bad_inputs = int((~torch.isfinite(xb)).sum())
    bad_tensors = [name for name, t in model.state_dict().items() if t.is_floating_point() and not t.isfinite().all()]
    if bad_inputs:
        cause = f"its input holds {bad_inputs} NaN or infinite value(s): check the data"
    elif bad_tensors:
        cause = (
            f"its input is finite, but the model holds NaN or infinity in {', '.join(bad_tensors[:3])}: rebuild "
            "it (BatchNorm's running statistics keep a NaN batch seen in training; NaN weights come from a "
            "diverged training: lower the learning rate)"
        )
    else:
        cause = "its input and the model are finite, so the model's outputs overflowed: try a lower learning rate"
    raise FloatingPointError(f"{where}: the loss is {loss}; {cause}")


def train_steps(model, batches, optimizer, scheduler):
    ours = {id(p) for p in model.parameters()}
    if any(id(p) not in ours for group in optimizer.param_groups for p in group["params"]):
        raise ValueError(
            "the optimizer holds parameters that are not this model's, so training would never change "
            "it: build the optimizer again from model.parameters(), and the scheduler from that optimizer"
        )
    model.train()  # BatchNorm: batch statistics; Dropout: on
    loss_sum, correct, seen, step_losses = 0.0, 0, 0, []
    for i, (xb, yb) in enumerate(batches):
        optimizer.zero_grad()
        logits = model(xb)
        loss = loss_fn(logits, yb)  # the mean over the batch
        value = loss.item()
        # before backward(), which would carry a NaN into every gradient and the optimizer into every weight
        check_finite(value, xb, model, f"training step {scheduler.last_epoch + 1} (batch {i} of this call)")
        loss.backward()
        optimizer.step()
        scheduler.step()  # one-cycle: the learning rate changes every step
        step_losses.append(value)
        loss_sum += value * len(yb)
        correct += (logits.argmax(dim=1) == yb).sum().item()
        seen += len(yb)
    return loss_sum / seen, correct / seen, step_losses


@torch.no_grad()  # no graph: evaluation never calls backward
def evaluate(model, loader):
    model.eval()  # BatchNorm: running statistics; Dropout: off
    loss_sum, correct, seen = 0.0, 0, 0
    for i, (xb, yb) in enumerate(loader):
        logits = model(xb)
        loss = loss_fn(logits, yb).item()
        check_finite(loss, xb, model, f"evaluation batch {i}")  # NaN logits still have an argmax: no accuracy from them
        loss_sum += loss * len(yb)
        correct += (logits.argmax(dim=1) == yb).sum().item()
        seen += len(yb)
    return loss_sum / seen, correct / seen


assert loss_fn.label_smoothing == 0.1

# %%
split = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(0)).to(device)
train_idx, val_idx = split[5_000:], split[:5_000]
print(f"training images: {len(train_idx):,} | validation images: {len(val_idx):,} | test images: {len(x_test):,}")
assert len(torch.unique(split)) == 60_000  # a partition: no image in both parts

smoothed = torch.full((10,), 0.01).index_fill(0, torch.tensor([3]), 0.91)  # the target of an image of a 3
print(
    f"smoothed target sums to {smoothed.sum():.2f}; loss floor = its entropy = {-(smoothed * smoothed.log()).sum():.2f}"
)
assert abs(loss_fn(smoothed.log()[None], torch.tensor([3])) + (smoothed * smoothed.log()).sum()) < 1e-6

# %% [markdown]
# One NaN pixel, in the second of two batches, with section 12's model:

# %%
images = x_train[:256].clone()
images[200, 0, 14, 14] = float("nan")
with pytest.raises(FloatingPointError) as stopped:
    evaluate(model, [(images[:128], y_train[:128]), (images[128:], y_train[128:256])])
print("FloatingPointError:", stopped.value)
with torch.no_grad():
    nan_images = int(model(images[128:]).isnan().any(dim=1).sum())  # eval mode: the NaN stays in its own image
print("images of that batch with NaN logits:", nan_images)
assert nan_images == 1 and str(stopped.value).startswith("evaluation batch 1: the loss is nan; its input holds 1 NaN")

# %% [markdown]
# `SummaryWriter` (TensorBoard) logs the metrics at each validation check, by step. Training results can differ in the last digits
# between CPU models, so the cell below prints what holds on every machine; the next one prints the run's numbers.
#
# **Threads.** The training run keeps the kernel's single thread. A second thread would speed it up on an idle
# 2-core machine, but `make test` runs two notebooks side by side on those two cores, and then three busy
# threads share two cores: each small parallel operation waits at a barrier for a thread that is not
# running; on the shared course machine we observed epochs about five times slower than with one thread (a
# machine-dependent observation, not checked here: `python -m benchmarks.mnist_speed --threads 2` measures it on
# yours). On your own machine, JupyterLab uses all cores.

# %%
seed_everything(0)
model = course_model().to(device)
EPOCHS, CHECKS, BATCH, MAX_LR = 1, 4, 128, 0.02
train_loader = tensor_loader(
    x_train[train_idx], y_train[train_idx], batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0)
)
val_loader = tensor_loader(x_train[val_idx], y_train[val_idx], batch_size=1000)
optimizer = torch.optim.AdamW(
    model.parameters(), lr=MAX_LR, betas=(0.9, 0.99), weight_decay=1e-4, fused=device.type in ("cpu", "cuda")
)
total_steps = EPOCHS * len(train_loader)
steps_per_check = -(-total_steps // CHECKS)  # rounded up: 108, 108, 108 and the last 106 steps
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=MAX_LR, total_steps=total_steps)
writer = SummaryWriter(str(RUN_DIR / "tensorboard"))

history = {
    "step": [],
    "train_loss": [],
    "train_acc": [],
    "val_loss": [],
    "val_acc": [],
    "seconds": [],
    "cpu_seconds": [],
}
step_losses = []
batches = (batch for _ in range(EPOCHS) for batch in train_loader)  # every batch of every epoch, in order
for _check in range(CHECKS):
    start, cpu_start = time.perf_counter(), time.process_time()
    train_loss, train_acc, losses = train_steps(model, itertools.islice(batches, steps_per_check), optimizer, scheduler)
    history["seconds"].append(time.perf_counter() - start)
    history["cpu_seconds"].append(time.process_time() - cpu_start)
    val_loss, val_acc = evaluate(model, val_loader)
    step_losses += losses
    step = scheduler.last_epoch  # steps taken so far
    for key, value in zip(
        ("step", "train_loss", "train_acc", "val_loss", "val_acc"), (step, train_loss, train_acc, val_loss, val_acc)
    ):
        history[key].append(value)
    writer.add_scalars("loss", {"train": train_loss, "validation": val_loss}, step)
    writer.add_scalar("accuracy/train", train_acc, step)
    writer.add_scalar("accuracy/validation", val_acc, step)
    writer.add_scalar("lr", scheduler.get_last_lr()[0], step)

print(f"epochs: {EPOCHS} | steps: {scheduler.last_epoch} | validation checks after steps {history['step']}")
print(f"final learning rate below 1e-5: {scheduler.get_last_lr()[0] < 1e-5}")
print(f"validation accuracy at the last check at least 98.5%: {history['val_acc'][-1] >= 0.985}")
show_warning(scheduler.get_lr, UserWarning, "get_last_lr")  # the notes' way to read the rate
assert scheduler.get_last_lr() == [optimizer.param_groups[0]["lr"]]
assert history["val_acc"][-1] >= 0.985 and history["step"][-1] == total_steps

# %% [markdown]
# Only now, with training finished and nothing left to choose, the **test set** is used, once:

# %%
test_loader = tensor_loader(x_test, y_test, batch_size=1000)
test_loss, test_acc = evaluate(model, test_loader)
print(f"test accuracy on {len(x_test):,} images: at least 99.0% ({test_acc >= 0.99})")
assert test_acc >= 0.99

# %%
# NBVAL_IGNORE_OUTPUT
train_seconds, cpu_seconds = sum(history["seconds"]), sum(history["cpu_seconds"])
for c in range(CHECKS):
    print(
        f"check {c + 1} (step {history['step'][c]}): {history['seconds'][c]:5.1f} s, "
        f"train loss {history['train_loss'][c]:.4f}, validation loss {history['val_loss'][c]:.4f}, "
        f"validation accuracy {history['val_acc'][c]:.2%}"
    )
print(f"test accuracy {test_acc:.2%}")
print(
    f"training time: {train_seconds:.1f} s ({cpu_seconds:.1f} s of CPU time, "
    f"{EPOCHS * len(train_idx) / train_seconds:,.0f} images/s) on {device.type}, torch threads: {torch.get_num_threads()}"
)
assert 0 < train_seconds < 600 and test_acc >= 0.99


def cpu_seconds_per_step(net, steps=8):
    """CPU time (not wall time: other programs do not count) of the fastest of `steps` training steps on a
    batch of 128: the minimum is the least disturbed by other programs sharing the core's caches."""
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, fused=True)
    xb, yb = x_train[:128], y_train[:128]
    times = []
    for _ in range(steps + 2):
        start = time.process_time()
        opt.zero_grad()
        loss_fn(net(xb), yb).backward()
        opt.step()
        times.append(time.process_time() - start)
    return min(times[2:])  # after two warm-up steps


if device.type == "cpu":
    t_last = cpu_seconds_per_step(course_model())
    t_first = cpu_seconds_per_step(course_model().to(memory_format=torch.contiguous_format))
    print(
        f"fastest of 8 steps: channels-last {t_last * 1000:.0f} ms, channels-first {t_first * 1000:.0f} ms of CPU time"
    )

# %% [markdown]
# ## 14. Curves, confusion matrix and the digits it gets wrong

#
# The first plot shows the loss of every training step, with the mean training loss of each quarter of the epoch
# and the validation loss at the end of it. Notice that at the first check the **validation loss is below the
# training loss**, which looks backwards. It is not: that training loss is the mean over the first 108 steps, and
# the model improved a lot during them, so the early, bad steps pull the mean up; the validation loss is measured
# once, with the model as it is at the check. And during training Dropout and BatchNorm's batch
# statistics add noise that evaluation does not have (this model has no Dropout, but the notes' models do).

# %%
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(range(1, len(step_losses) + 1), step_losses, lw=0.5, alpha=0.6, label="training loss of each step")
ax.plot(history["step"], history["train_loss"], "o-", label="training loss, mean since the previous check")
ax.plot(history["step"], history["val_loss"], "s-", label="validation loss at the check")
ax.set(xlabel="step", ylabel="cross-entropy", yscale="log", title="Loss of the course model")
ax.legend()
plt.show()
plot_curves(
    {"train": history["train_acc"], "validation": history["val_acc"]},
    xlabel="validation check",
    ylabel="accuracy",
    title="accuracy",
)
plt.show()
print(
    "steps logged:",
    len(step_losses),
    "| check 1: validation loss below the mean training loss:",
    history["val_loss"][0] < history["train_loss"][0],
)
print(f"validation loss fell from check 1 to {CHECKS}:", history["val_loss"][-1] < history["val_loss"][0])
assert len(step_losses) == total_steps
assert history["val_loss"][0] < history["train_loss"][0] and history["val_loss"][-1] < history["val_loss"][0]

# %% [markdown]
# The **confusion matrix (混淆矩阵)** counts, for each true digit (row), which digit the model predicted (column);
# the diagonal holds the correct predictions, so its sum divided by 10000 is the accuracy. With 99% right, the
# diagonal (about 1000 per digit) would swamp the colour scale, so the heat map shows the **errors only** (the
# diagonal set to zero): the darkest cells are the pairs of digits the model confuses most. The row sums are the
# number of test images of each digit.

# %%
model.eval()
with torch.no_grad():
    preds = torch.cat([model(xb).argmax(dim=1) for xb, _ in test_loader]).cpu()
targets = y_test.cpu()
confusion = torch.bincount(targets * 10 + preds, minlength=100).view(10, 10)
assert torch.equal(confusion.sum(1), torch.bincount(targets, minlength=10))  # rows: the true digits
assert confusion.trace().item() == round(test_acc * 10000)
print("test images per digit (row sums):", confusion.sum(1).tolist())
print("diagonal / 10000 equals the test accuracy:", confusion.trace().item() / 10000 == test_acc)
errors_only = confusion - torch.diag(confusion.diag())
plot_matrix(
    errors_only,
    xlabels=[str(i) for i in range(10)],
    ylabels=[str(i) for i in range(10)],
    title="test errors (rows: true, columns: predicted; diagonal removed)",
    cmap="Reds",
    annotate=True,
)
plt.show()

# %%
wrong = (preds != targets).nonzero().squeeze(1)
show_idx = wrong[:24]
mistakes = (x_test[show_idx.to(device)].cpu() * std + mean).clamp(0, 1)
plot_image_grid(
    mistakes, titles=[f"true {t} → {p}" for t, p in zip(targets[show_idx].tolist(), preds[show_idx].tolist())]
)
plt.show()
print("misclassified test digits fewer than 100:", len(wrong) < 100)
assert len(wrong) == 10000 - confusion.trace().item()

# %% [markdown]
# ## 15. TensorBoard
#
# The writer already holds the scalars of each validation check. We add an image (the misclassified digits), the model
# graph and a hyper-parameter record, then read the event files back with `utils.tb.read_events` to prove
# what is there.
#
# `add_graph` records the graph by *tracing* the model with `torch.jit.trace`, which PyTorch has deprecated in
# favour of `torch.compile`/`torch.export`; TensorBoard has no other way yet, so the cell prints (and checks)
# the `FutureWarning` instead of hiding it. `add_hparams` writes by default
# into a new sub-folder named after the clock; `run_name="."` keeps it in the same run folder.

# %%
writer.add_image("misclassified", make_grid(mistakes, nrow=8), global_step=total_steps)
model.eval()
show_warning(lambda: writer.add_graph(model, x_test[:2]), FutureWarning, "jit.trace")
writer.add_hparams(
    {"epochs": EPOCHS, "batch_size": BATCH, "max_lr": MAX_LR, "optimizer": "AdamW"},
    {"hparam/test_accuracy": test_acc},
    run_name=".",
)
writer.close()

events = read_events(RUN_DIR / "tensorboard")
print("scalars:", sorted(events.scalars))
print("checks logged per scalar:", sorted({len(v) for k, v in events.scalars.items() if not k.startswith("hparam")}))
print(
    "images:", events.images, "| graph logged:", events.graph_nodes > 0, "| hparams records:", len(events.hparams) > 0
)
assert {"accuracy/validation", "accuracy/train", "lr", "hparam/test_accuracy"} <= set(events.scalars)
assert events.images == {"misclassified": 1} and events.graph_nodes > 0 and events.hparams

# %% [markdown]
# `add_scalars` (plural) writes each curve into its own sub-folder (`loss_train/`, `loss_validation/`), so TensorBoard
# draws them in one chart. To look at all of it, run in a notebook cell (or `tensorboard --logdir runs` in a
# terminal from the repository root):
#
# ```python
# %load_ext tensorboard
# %tensorboard --logdir ../runs/04_mnist_cnn/tensorboard
# ```

# %%
sub_runs = sorted(p.name for p in (RUN_DIR / "tensorboard").iterdir() if p.is_dir())
loss_curves = {name: read_events(RUN_DIR / "tensorboard" / name).scalars["loss"] for name in sub_runs}
print("sub-folders:", sub_runs, "| points per curve:", [len(v) for v in loss_curves.values()])
assert sub_runs == ["loss_train", "loss_validation"]
assert [v for _, v in loss_curves["loss_train"]] == pytest.approx(history["train_loss"])

# %% [markdown]
# ## Exercises (练习)
#
# Three exercises, easiest first: predict, write a function, then a stretch that combines this notebook with
# notebook 02. Each has a **stub cell** that starts with `# ✏️ Exercise N`: edit it and run it. The **check cell**
# below it then says *correct*, or *not yet* with a hint and the section to re-read, or *not attempted yet* while
# the stub is untouched. This section does not depend on the lesson's cells (the checks make their own tiny data,
# not MNIST): after a kernel restart, run its first cell and go on. `make progress` lists which exercises of every
# notebook pass.

# %%
import torch
import torch.nn as nn
import torch.nn.functional as F

from utils.exercises import Checker

ex = Checker("04")

# %% [markdown]
# ### Exercise 1 · Predict shapes and the parameter count
#
# Section 10's output-size formula and parameter count, on a model you have not seen. Its first convolution has a
# 5×5 kernel, stride 2 and padding 1, and `n_features` stands for the number of features per image that `Flatten`
# returns, which you work out too:
#
# ```python
# net = nn.Sequential(
#     nn.Conv2d(1, 8, kernel_size=5, stride=2, padding=1),
#     nn.MaxPool2d(2),
#     nn.Conv2d(8, 16, kernel_size=3, bias=False),
#     nn.BatchNorm2d(16),
#     nn.ReLU(),
#     nn.Flatten(),
#     nn.Linear(n_features, 10),
# )
# x = torch.zeros(32, 1, 28, 28)  # a batch of 32 MNIST-sized images
# ```
#
# Predict, on paper first: the shape of `net[0](x)`, the shape of `net[:6](x)` (what `Flatten` returns), and the
# number of parameters, `sum(p.numel() for p in net.parameters())`. Write them as a list `[tuple, tuple, int]`,
# then check. (Building the model afterwards to see why is allowed.) One fact the lesson only used: a
# `BatchNorm2d(C)` learns a scale $\gamma$ and a shift $\beta$ per channel (section 12), while its running mean and
# variance (section 13) are **buffers** (缓冲区): saved in `state_dict()`, but not returned by `parameters()`.

# %%
# ✏️ Exercise 1: replace ... with [shape of net[0](x), shape of net[:6](x), number of parameters]
answer_1 = ...

# %%
ex.check(1, answer_1)

# %% [markdown]
# ### Exercise 2 · Evaluate a classifier
#
# Write `evaluate_classifier(model, loader)` for a model that returns logits and a `DataLoader` of `(xb, yb)`
# batches. Return two Python floats, over all the batches: the mean cross-entropy per **sample** (plain
# `F.cross_entropy`, not section 13's label-smoothed `loss_fn`) and the accuracy, a fraction between 0 and 1. The
# check hands you a model with `BatchNorm1d` and `Dropout` that arrives in training mode, as after a training
# epoch, and a loader whose last batch is smaller than the others. The notes warn that `model.eval()` is not `torch.no_grad()`; section 13 says what each
# one does, and evaluation needs both.


# %%
# ✏️ Exercise 2: write the body of the function
def evaluate_classifier(model: nn.Module, loader) -> tuple[float, float]:
    raise NotImplementedError("your code here")


# %%
ex.check(2, evaluate_classifier)

# %% [markdown]
# ### Exercise 3 · Gradient accumulation (stretch)
#
# The notes' tip on **gradient accumulation (梯度累加)**: when a batch of 64 does not fit in memory, split it into
# two batches of 32, run two forward passes, then one backward pass. Write `accumulation_step(model,
# micro_batches, optimizer)`. `micro_batches` is a list of `(x, y)` pairs, not all of the same size. Make **one**
# optimizer step whose update is the one a single step on all of them concatenated would make, with
# `F.cross_entropy` (the mean over the samples) as the loss, and return that mean loss per sample as a float,
# computed before the update. As in a training loop, the previous step's gradients are still in `.grad` when the
# function is called. This is section 12's five-line step combined with notebook 02's section 4: `.grad` adds up
# across backward passes.
#
# A question to think about (not checked): the notes warn that accumulation does not mix well with BatchNorm. Why
# would it not equal one big batch for a model with `BatchNorm2d`, even with the right scaling?


# %%
# ✏️ Exercise 3: write the body of the function
def accumulation_step(model: nn.Module, micro_batches: list, optimizer: torch.optim.Optimizer) -> float:
    raise NotImplementedError("your code here")


# %%
ex.check(3, accumulation_step)

# %% [markdown]
# ## Summary
#
# * Data ships with the course and is checked (MD5) before use; `torchvision.datasets.MNIST(download=False)`
#   reads it. A damaged file fails with a message naming it.
# * A `Dataset` needs `__len__` and `__getitem__` (and should check its index). `DataLoader` combines a sampler
#   (`sampler` **or** `batch_sampler`), a `collate_fn` that receives the list of *samples*, worker processes,
#   and a seeded `generator` for repeatable order and worker seeds.
# * Classes and functions used inside workers must be importable (`spawn`/`forkserver` pickle them by name).
# * `transforms.v2`: `ToImage` + `ToDtype(scale=True)` + `Normalize` with the data's own mean and std.
#   Use `next(iter(loader))`, not `.next()`.
# * Small data sets belong in memory as tensors (on the GPU when there is one): batches become slices.
# * Print shapes with forward hooks, not `print` inside `forward`. Return logits: `CrossEntropyLoss` applies
#   `log_softmax` itself, and a softmax before it slows training.
# * Training is five lines per step, repeated over epochs: `model.train()` before training (BatchNorm uses batch
#   statistics, Dropout drops), `model.eval()` and `torch.no_grad()` for evaluation, accuracy and loss summed
#   over the samples. A validation split watches training; the test set is used once, at the end. With
#   BatchNorm, AdamW, a one-cycle schedule and label smoothing, a 29k-parameter CNN passes 99% test accuracy in
#   one epoch;
#   a fused optimizer, and on many CPUs channels-last memory, make each step cheap.
# * BatchNorm does not commute with pooling (ReLU does): moving pooling before it makes a different model.
# * Early in training the validation loss can sit below the training loss: the training loss is a mean over
#   steps during which the model improved.
# * TensorBoard: `SummaryWriter` for scalars, images, the graph (`add_graph` traces, with a `FutureWarning`)
#   and hyper-parameters; `read_events` proves what was written.
