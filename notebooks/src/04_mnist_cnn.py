# %% [markdown]
# # 04 · MNIST and convolutional networks (卷积神经网络): data pipeline, training loop, GPU, TensorBoard
#
# This lesson takes 70,000 handwritten digits from raw files to a trained **convolutional neural network**
# (卷积神经网络, CNN) that recognises 99 % of the digits it has never seen, and then looks at what it gets wrong.
# You will learn to:
#
# 1. build a **data pipeline**: a **dataset** (数据集, `Dataset`) that turns an index into a sample, a **sampler**
#    (采样器) that picks the indices, a `collate_fn` that turns samples into a **batch** (批量), and the **data
#    loader** (数据加载器, `DataLoader`) that runs them, in worker processes if you ask;
# 2. measure what one sample costs (opening a file, decoding an image, transforming it) and make it almost free by
#    holding the whole data set as tensors in memory;
# 3. work out a convolution's output size and parameter count before running it, use a layer as a module or as a
#    function, and check every layer's output shape with forward hooks;
# 4. explain softmax, cross-entropy and why a classification loss takes raw scores (logits), and spot a softmax that
#    should not be there;
# 5. write the training loop yourself: five lines per step, `train()`/`eval()`, `torch.no_grad()`, a validation set
#    watched during training and a test set used once. A small CNN passes 99 % test accuracy in one epoch on a
#    laptop CPU;
# 6. read the results: loss curves, a confusion matrix (混淆矩阵), the misclassified digits, and TensorBoard.
#
# **You should know:** tensors (notebook 01); autograd and the small training loop at the end of notebook 02
# (`nn.Linear`, a loss, `optimizer.zero_grad()`, `backward()`, `optimizer.step()`); forward hooks (notebook 03).
# How to write a model of your own as an `nn.Module` is explained here, where it is first needed (section 10.2);
# notebook 10 shows its internals.
#
# **Study time:** about 155 min, exercises included. The cells run in about half a minute; training the model
# takes a few seconds of that.
#
# The course was built from a teacher's study notes (in Chinese, for PyTorch 1.x). The models `Net` and
# `CNNnet`, the small `Dataset` and sampler of sections 2–4 and the first training recipe come from them; the last
# section lists what they got wrong and where this lesson shows it.
#
# **On a GPU.** `get_device()` picks CUDA when it is present: the data set is then copied to GPU memory once
# (about 180 MiB) and the model trains there; the per-sample `DataLoader` uses pinned memory with
# `non_blocking` copies. Nothing in the notebook names a device; the stored outputs were made on the CPU.

# %%
# Opened alone? (单独打开) In the course's own folder this cell does nothing. Opened alone (in Colab, or
# downloaded without the rest of the course), it fetches the course (its helpers, data and pinned packages) from
# COURSE and runs this notebook inside it.
try:
    import utils.syllabus  # noqa: F401 - the course's helpers: found when this notebook runs in its course
except ModuleNotFoundError:
    import os
    from pathlib import Path
    from urllib.request import urlopen

    COURSE = os.environ.get("TORCH_COURSE_REPOSITORY", "").rstrip("/").removesuffix(".git")
    beside = Path.cwd().parent / "tools" / "opened_alone.py"  # the course is here, but not installed
    if not (beside.is_file() or COURSE):
        raise ModuleNotFoundError(
            "opened without its course, which names no repository to fetch it from: set the environment variable "
            "TORCH_COURSE_REPOSITORY to the course's location (a GitHub address), or get the whole course"
        ) from None
    raw = "/raw/HEAD" if COURSE.startswith("https://github.com/") else ""
    code = beside.read_bytes() if beside.is_file() else urlopen(f"{COURSE}{raw}/tools/opened_alone.py").read()
    exec(code, {"__name__": "opened_alone", "COURSE": COURSE})

# %% [markdown]
# ## Setup
#
# `seed_everything(0)` seeds Python's `random`, NumPy and torch, so the random numbers below are the same in every
# run (notebook 12 is about reproducibility); `get_device()` picks the GPU when there is one.

# %%
import inspect
import io
import itertools
import math
import pickle
import shutil
import subprocess
import sys
import time
from collections import OrderedDict

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
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
    SlowImages,
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
print("device:", device.type, "| outputs go to", relpath(RUN_DIR))

# %% [markdown]
# ## 1. The data: MNIST shipped with the course
#
# MNIST is 70000 grey-scale 28×28 images of handwritten digits (60000 for training, 10000 for testing) by
# Yann LeCun, Corinna Cortes and Christopher J.C. Burges (CC BY-SA 3.0, see `data/README.md`). The usual way to get
# it is `torchvision.datasets.MNIST(root="./data", download=True)`, which fetches four files from the internet
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
print("images per digit (train):", torch.bincount(train_set.targets).tolist())  # bincount: how often each value occurs
assert len(train_set) == 60000 and len(test_set) == 10000

# %% [markdown]
# `train_set[i]` is an `(image, label)` pair. Without a transform, torchvision's MNIST returns a PIL image (the
# image type of the Pillow library, which torchvision's classic image transforms take as input).

# %%
img, label = train_set[0]
print(type(img).__name__, img.mode, img.size, "label", label)
assert img.size == (28, 28) and label == 5

# %% [markdown]
# A damaged copy must fail loudly, naming the file and the fix, instead of training on garbage. Here are a
# missing file and a truncated one, in a scratch folder under `runs/`:

# %%
broken = RUN_DIR / "broken_mnist"
broken.mkdir()
shutil.copy(MNIST_SOURCE_DIR / "MD5SUMS.raw", broken)
try:
    prepare_mnist(source_dir=broken, root=broken / "root")
except FileNotFoundError as err:
    print(type(err).__name__ + ":", err)

gz = MNIST_SOURCE_DIR / "train-images-idx3-ubyte.gz"
(broken / gz.name).write_bytes(gz.read_bytes()[:100_000])  # the first 100 kB of a 9.7 MB file
try:
    prepare_mnist(source_dir=broken, root=broken / "root")
except RuntimeError as err:
    print(type(err).__name__ + ":", err)

# %% [markdown]
# ## 2. The data pipeline, part 1: a `Dataset` turns an index into a sample
#
# Training reads the data in **batches** (批量) of a few dozen to a few hundred samples. Three small objects make
# the batches, and a `DataLoader` runs them in turn:
#
# ```text
# sampler         →  indices 17, 3, 42, …                     which samples, in what order     (section 4)
# dataset[i]      →  one sample per index: (image, label)     read, decode, transform one      (this section)
# collate_fn      →  the list of samples → one batch          stack into tensors               (section 3)
# ```
#
# A **map-style** (映射式) dataset is any object with `__len__` (how many samples) and `__getitem__(i)` (sample `i`);
# subclassing `torch.utils.data.Dataset` says so to the reader. (The other kind, an *iterable-style*
# `IterableDataset`, yields its samples in its own order, for streams that cannot be indexed; this lesson does not
# need one.) Here is a dataset over the MNIST pixels, which torchvision's object keeps in one `uint8` tensor: sample
# `i` is the image as a `[1, 28, 28]` tensor (one channel) and its label as a Python `int`.


# %%
class DigitImages(Dataset):
    """MNIST images as uint8 tensors [1, 28, 28] with their labels, read from two tensors in memory."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i].unsqueeze(0), int(self.labels[i])


digits = DigitImages(train_set.data, train_set.targets)
image, label = digits[0]
print(f"len(digits) = {len(digits)} | digits[0]: image {tuple(image.shape)} {image.dtype}, label {label}")
try:
    digits[60_000]
except IndexError as err:  # indexing a tensor checks the index
    print(type(err).__name__ + ":", err)
assert len(digits) == 60_000 and image.shape == (1, 28, 28) and label == 5

# %% [markdown]
# A dataset can also *compute* each sample from its index instead of reading it. `MyDataset(n)` returns the array
# `[-2i, -2i]` for index `i`. It never checks `i`, so it answers any index, even 15 for a dataset of 10 samples:
# section 4 shows the bug this hides.


# %%
class MyDataset(Dataset):
    def __init__(self, length):
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, idx):
        return np.array([-idx * 2, -idx * 2])  # no check of idx


ds = MyDataset(10)
print("ds[3] =", ds[3], "| ds[15] =", ds[15], "| len(ds) =", len(ds))
assert ds[15].tolist() == [-30, -30] and len(ds) == 10

# %% [markdown]
# ## 3. The data pipeline, part 2: `DataLoader` and `collate_fn` turn samples into batches
#
# `DataLoader(dataset, batch_size=128)` takes 128 indices at a time from its sampler, reads `dataset[i]` for each
# (or, if the dataset defines `__getitems__`, passes it all 128 indices in one call: section 8.1), and hands that
# **list of samples** to its `collate_fn`. The default, `default_collate`, stacks tensors along a new
# first dimension, turns Python numbers and NumPy arrays into tensors, and keeps the structure of a sample: samples
# that are `(image, label)` pairs make a batch that is an `(images, labels)` pair.
#
# A loader is iterable: `for images, labels in loader:` runs one **epoch** (轮次), one pass over the data.
# `next(iter(loader))` starts a pass and takes only its first batch. Note the two lengths: `len(dataset)` counts
# samples, `len(loader)` counts batches (training steps).

# %%
loader = DataLoader(digits, batch_size=128)
batch_images, batch_labels = next(iter(loader))
print(f"a batch: images {tuple(batch_images.shape)} {batch_images.dtype}, labels {tuple(batch_labels.shape)}")
samples = next(iter(DataLoader(digits, batch_size=3, collate_fn=lambda samples: samples)))  # collate nothing
print("what collate_fn receives:", type(samples).__name__, [(tuple(x.shape), y) for x, y in samples])
# the sampler picks indices, the batch sampler groups them into lists: section 4
print(f"the loader's sampler: {type(loader.sampler).__name__}, grouped by a {type(loader.batch_sampler).__name__}")
for drop in (False, True):
    index_lists = list(DataLoader(digits, batch_size=128, drop_last=drop).batch_sampler)  # indices only: cheap
    print(f"drop_last={drop}: {len(index_lists)} batches, the last of {len(index_lists[-1])} samples")
assert batch_images.shape == (128, 1, 28, 28) and torch.equal(batch_labels, train_set.targets[:128])
assert len(loader) == 469 and len(DataLoader(digits, batch_size=128, drop_last=True)) == 468

# %% [markdown]
# The default collation needs samples of one shape. Real images often differ in size; here each digit is cut to
# its bounding box (the rows and columns that hold ink), so the samples are 20×20, 20×17, 20×14, …, and stacking
# them fails. A `collate_fn` of your own makes the batch rectangular: it pads every image with zeros to the
# largest height and width of *its* batch and returns the true sizes too, so a model can ignore the padding.
# (Sequences of different lengths are padded the same way; `nn.utils.rnn.pad_sequence` does it in one call, and
# notebook 05 uses it for sentences.)


# %%
class CroppedDigits(Dataset):
    """Each MNIST digit cut to its bounding box: images of different sizes."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        img = self.images[i]
        rows = img.any(dim=1).nonzero().squeeze(1)  # the rows with at least one non-zero pixel
        cols = img.any(dim=0).nonzero().squeeze(1)
        return img[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1].unsqueeze(0), int(self.labels[i])


def pad_collate(samples):
    """A batch of images of different sizes: zero-padded to the largest height and width, with the true sizes."""
    height = max(x.shape[1] for x, _ in samples)
    width = max(x.shape[2] for x, _ in samples)
    images = torch.zeros(len(samples), 1, height, width, dtype=samples[0][0].dtype)
    for k, (x, _) in enumerate(samples):
        images[k, :, : x.shape[1], : x.shape[2]] = x
    sizes = torch.tensor([tuple(x.shape[1:]) for x, _ in samples])
    labels = torch.tensor([y for _, y in samples])
    return images, sizes, labels


cropped = CroppedDigits(train_set.data, train_set.targets)
print("sample sizes:", [tuple(cropped[i][0].shape[1:]) for i in range(8)])
try:
    next(iter(DataLoader(cropped, batch_size=8)))
except RuntimeError as err:
    print(type(err).__name__ + ":", err)
padded, sizes, labels = next(iter(DataLoader(cropped, batch_size=8, collate_fn=pad_collate)))
print("with pad_collate:", tuple(padded.shape), "| sizes", sizes.tolist(), "| labels", labels.tolist())
for k in range(8):
    h, w = sizes[k].tolist()
    assert torch.equal(padded[k, :, :h, :w], cropped[k][0]) and padded[k].sum() == cropped[k][0].sum()  # zeros
plot_image_grid(padded, titles=[f"{h}×{w}" for h, w in sizes.tolist()])
plt.show()

# %% [markdown]
# The `DataLoader` arguments at a glance:
#
# | argument | what it does |
# |---|---|
# | `batch_size`, `drop_last` | samples per batch; drop the last, smaller batch |
# | `shuffle` | a new random order every epoch (a `RandomSampler` under the hood) |
# | `sampler` | your own order of *single* indices; excludes `shuffle` |
# | `batch_sampler` | yields whole *lists* of indices; excludes `batch_size`, `shuffle`, `sampler`, `drop_last` |
# | `collate_fn` | turns the list of samples into a batch (default: stack and convert to tensors) |
# | `num_workers` | load batches in that many worker processes (0: in the main process; section 5) |
# | `worker_init_fn` | called in each worker with its id, after seeding, before loading |
# | `generator` | the random generator for shuffling and for the workers' seeds: reproducible runs |
# | `pin_memory` | put batches in **pinned memory** (固定内存: page-locked host memory) for fast, asynchronous copies to a GPU |
# | `timeout` | seconds to wait for a worker's batch before raising an error (0: wait for ever; section 5) |
# | `prefetch_factor`, `persistent_workers` | batches each worker loads ahead; keep the workers between epochs |
#
# The exclusions are checked when the loader is built:

# %%
for kwargs in (dict(shuffle=True, sampler=SequentialSampler(ds)), dict(batch_size=4, batch_sampler=[[0, 1]])):
    try:
        DataLoader(ds, **kwargs)
    except ValueError as err:
        print(f"{sorted(kwargs)}: {type(err).__name__}: {err}")
print(
    "shuffle=True uses a",
    type(DataLoader(ds, shuffle=True).sampler).__name__,
    "| shuffle=False uses a",
    type(DataLoader(ds).sampler).__name__,
)
assert isinstance(DataLoader(ds, shuffle=True).sampler, RandomSampler)

# %% [markdown]
# A seeded `generator` makes the shuffled order repeatable without touching the global random state, and the same
# loader still gives a new order in every epoch:


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

# %% [markdown]
# ## 4. The data pipeline, part 3: samplers choose the indices
#
# A sampler decides which indices are read, in which order. It is any iterable of indices; `len(loader)` also
# needs its `__len__`. The built-in ones:
#
# * `SequentialSampler(ds)`: 0, 1, 2, … (what `shuffle=False` uses);
# * `RandomSampler(ds, replacement=False, num_samples=None)`: a permutation, or draws with replacement;
# * `SubsetRandomSampler(indices)`: a random order of *the given indices only*, e.g. to read a validation split
#   out of a larger set;
# * `WeightedRandomSampler(weights, num_samples, replacement=True)`: index `i` is drawn with probability
#   proportional to `weights[i]`, e.g. to balance rare classes;
# * `BatchSampler(sampler, batch_size, drop_last)`: groups any sampler's indices into lists (what `batch_size`
#   does inside the loader, section 3).

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
# `WeightedRandomSampler` on real batches. `Subset(dataset, indices)` is the dataset of the given indices only;
# here it holds 900 zeros and 100 ones, so a batch of 100 read in order or shuffled has about 10 ones. Giving each
# sample the weight `1 / (number of samples of its class)` makes both classes equally likely: each batch is about
# half ones. The sampler draws with replacement, so each `1` is seen about five times per epoch: balancing repeats
# the rare samples, it does not add new ones.

# %%
zeros = (train_set.targets == 0).nonzero().squeeze(1)[:900]
ones = (train_set.targets == 1).nonzero().squeeze(1)[:100]
rare = Subset(digits, torch.cat([zeros, ones]).tolist())
rare_labels = train_set.targets[torch.cat([zeros, ones])]
weights = 1.0 / torch.bincount(rare_labels)[rare_labels].double()
sampler = WeightedRandomSampler(weights, num_samples=len(rare), generator=torch.Generator().manual_seed(0))
plain = DataLoader(rare, batch_size=100, shuffle=True, generator=torch.Generator().manual_seed(0))
balanced = DataLoader(rare, batch_size=100, sampler=sampler)
ones_plain = [int(yb.sum()) for _, yb in plain]  # the labels are 0 and 1: their sum counts the ones
ones_balanced = [int(yb.sum()) for _, yb in balanced]
print("ones per batch of 100, shuffled:", ones_plain)
print("ones per batch of 100, weighted:", ones_balanced)
assert sum(ones_plain) == 100 and abs(sum(ones_balanced) - 500) < 60

# %% [markdown]
# A batch sampler of your own yields whole lists of indices (`batch_sampler=`). A classic mistake is one that does
# not know the data's size: `MySampler(20)` yields `[i, i + 1]` for `i` up to 19, whatever the dataset. With
# `MyDataset(10)`, which answers any index (section 2), nothing complains: the loader returns 20 batches, the last
# ones made of samples that do not exist. Without `__len__`, iterating works but `len(loader)` fails.


# %%
class MySampler(Sampler):
    def __init__(self, batch_nums):
        self.batch_nums = batch_nums

    def __iter__(self):
        for i in range(self.batch_nums):
            yield [i, i + 1]


batches = list(DataLoader(ds, batch_sampler=MySampler(20), collate_fn=lambda samples: samples))
print("batches from a 10-sample dataset:", len(batches), "| last batch:", [b.tolist() for b in batches[-1]])
try:
    len(DataLoader(ds, batch_sampler=MySampler(20)))
except TypeError as err:
    print(type(err).__name__ + ":", err)
assert len(batches) == 20 and batches[-1][1].tolist() == [-40, -40]  # "sample 20" of a 10-sample dataset

# %% [markdown]
# The fix: the dataset checks its index (like a list, it raises `IndexError`), and the batch sampler knows its
# length and stays inside the data. `NegatedPairs` in `utils/data.py` is `MyDataset` with the check.


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
    print(type(err).__name__ + ":", err)
assert len(fixed) == len(list(fixed)) == 5

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
# **Random numbers in the workers.** Each time an iterator is created (each epoch, unless `persistent_workers=True`:
# then the workers are seeded once and their generators simply continue), the loader draws a base seed (from its
# `generator` when it has one, else from torch's global generator). Before it loads anything, worker `k` seeds
# three generators itself: torch's and Python's `random` with `base_seed + k`, and NumPy's with a value made from
# both. So the workers draw
# different numbers, and a seeded `generator` makes them repeat, whichever of the three libraries a random
# augmentation uses. `WorkerTagged` (in `utils/data.py`) returns, for each index, the worker that loaded it and
# one random draw from torch and one from NumPy in that worker. (The demos are tiny: starting processes costs
# time.)


# %%
def worker_rows(seed, worker_init_fn=None):
    loader = DataLoader(
        WorkerTagged(8),
        batch_size=2,
        num_workers=2,
        worker_init_fn=worker_init_fn,
        generator=torch.Generator().manual_seed(seed),
    )
    return [tuple(int(v) for v in row) for batch in loader for row in zip(*batch)]


rows = worker_rows(0)
print("index, worker, torch draw, numpy draw")
for r in rows:
    print(" ", r)
again, other = worker_rows(0), worker_rows(1)
print("generator seed 0 again: the same draws:", again == rows, "| seed 1: other draws:", other != rows)
assert [r[1] for r in rows] == [0, 0, 1, 1, 0, 0, 1, 1] and again == rows and other != rows
by_worker = [[r[2:] for r in rows if r[1] == k] for k in (0, 1)]
assert by_worker[0] != by_worker[1]  # the two workers draw different numbers

# %% [markdown]
# PyTorch's reproducibility guide gives a `worker_init_fn` called `seed_worker` (in `utils/data.py`: a worker
# started with `spawn` must import it). It re-seeds NumPy and `random` from the worker's torch seed,
# `torch.initial_seed() % 2**32`. The loader already seeds both, so `seed_worker` changes the NumPy draws
# (the torch draws stay as they were) but adds nothing to repeatability. Write a `worker_init_fn` for what the
# loader does not seed, such as another library's random generator, or for per-worker set-up such as opening a
# file.

# %%
with_init = worker_rows(0, worker_init_fn=seed_worker)
same_torch = [r[2] for r in with_init] == [r[2] for r in rows]
same_numpy = [r[3] for r in with_init] == [r[3] for r in rows]
print(
    "with seed_worker: torch draws",
    "unchanged" if same_torch else "changed",
    "| NumPy draws:",
    [r[3] for r in with_init],
)
assert same_torch and not same_numpy

# %% [markdown]
# `timeout=t` makes the main process give up when a worker has not delivered a batch within `t` seconds: it raises
# an error and the epoch stops (the default, 0, waits for ever). It guards against a worker stuck on a network read.
# `SlowImages(io_ms=1000)`, also in `utils/data.py`, takes one second per sample, like a very slow disk.

# %%
slow = DataLoader(SlowImages(1, io_ms=1000), num_workers=1, timeout=0.5)
try:
    next(iter(slow))
except RuntimeError as err:
    timed_out = str(err)
    print(type(err).__name__ + ":", err)
assert "timed out after 0.5 seconds" in timed_out

# %% [markdown]
# ## 6. `transforms.v2`: from PIL image to a normalised tensor
#
# Many tutorials and older code convert images with `transforms.ToTensor()` and then `Normalize((0.5,), (0.5,))`.
# Today's API is `torchvision.transforms.v2`: `ToImage()` (PIL → uint8 tensor image) and
# `ToDtype(torch.float32, scale=True)` (→ floats in [0, 1]) replace `ToTensor`. The classic `transforms.ToTensor`
# still works without a warning, while its v2 twin, `v2.ToTensor`, is deprecated. (`show_warning`, from `utils`,
# runs a call and prints the warning it raises; it fails if that warning is gone.) And instead of guessing 0.5, we
# compute the mean and standard deviation of the training pixels, so that the normalised inputs have mean 0 and
# standard deviation 1. The 47 million pixels take only 256 values, so a histogram (`bincount`) gives both
# statistics exactly and fast.

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

show_warning(v2.ToTensor, UserWarning, "deprecated")  # use ToImage + ToDtype instead
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
# Code written for PyTorch before 1.13 often takes one batch with `dataiter.next()`. That worked because the
# DataLoader's iterator kept a Python 2 style `.next()` method as an alias, until PyTorch 1.13 removed it (Python 3
# itself had renamed the protocol to `__next__` long before): the built-in `next(iterator)` is the way.
# `torchvision.utils.make_grid` tiles a batch into one image (it repeats a single channel three times), and
# matplotlib wants the channels last.

# %%
train_tf = load_mnist(train=True, transform=transform)
loader = DataLoader(train_tf, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
dataiter = iter(loader)
try:
    dataiter.next()
except AttributeError as err:
    print(type(err).__name__ + ":", err)
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
# ## 8. What a sample costs, and how to make it cheap
#
# ### 8.1 Tensors in memory: batches become slices
#
# The per-sample pipeline does, for every image of every epoch: index → PIL image → `ToImage` → `ToDtype` →
# `Normalize` → stack 128 of them. That is tens of microseconds of Python per image (measured below), about as long
# as the small CNN of section 12 needs to train on it. MNIST is tiny (60000 × 784 float32 values, about
# 180 MiB), so we do the transform **once**, for the whole set, with the same operations in the same order, and
# keep two tensors: the numbers are bit for bit those of the v2 pipeline. The arithmetic runs on the CPU and the
# result is then moved to the device: a GPU divides by a scalar as a multiplication by its inverse, which rounds
# differently. (`mnist_tensors()` in `utils/data.py` is this line, for either split.)

# %%
x_cpu = train_set.data.unsqueeze(1).to(torch.float32).mul_(1.0 / 255).sub_(mean).div_(std)  # [60000, 1, 28, 28]
x_train, y_train = mnist_tensors(train=True, device=device)
x_test, y_test = mnist_tensors(train=False, device=device)
print("x_train", tuple(x_train.shape), x_train.dtype, x_train.device.type, f"| {x_train.nbytes / 2**20:.0f} MiB")
assert torch.equal(x_train.cpu(), x_cpu) and torch.equal(y_train.cpu(), train_set.targets)
# as_subclass(torch.Tensor): the same data (no copy) with torchvision's Image type dropped, as a plain tensor
same = [torch.equal(x_train[i].cpu(), train_tf[i][0].as_subclass(torch.Tensor)) for i in (0, 1, 59999)]
print("images 0, 1 and 59999 equal to the v2 pipeline's, bit for bit:", same)
assert all(same)

# %% [markdown]
# Batches are then slices of those tensors, and the sampler machinery of section 4 makes them.
# `TensorDataset(x, y)` is the built-in dataset over tensors: sample `i` is `(x[i], y[i])`, and since a tensor
# accepts a list of indices, `dataset[[i, j, k]]` returns a whole batch in one indexing operation. So the sampler
# is a `BatchSampler` that yields lists of indices, and `batch_size=None` turns the loader's own batching off: it
# hands each list to the dataset as one "index" and does not stack: its collate function becomes `default_convert`,
# which only turns NumPy arrays into tensors. (`tensor_loader()` in `utils/data.py` is these lines; the rest of the
# notebook uses it.) The official hook for the same idea is a `__getitems__(indices)` method on the dataset: with
# automatic batching the loader then passes it the whole list of indices in one call (`Subset` defines it, and
# forwards the list to the dataset it wraps) and collates the list of samples it returns.

# %%
tensors = TensorDataset(x_train, y_train)
g = torch.Generator().manual_seed(0)
fast = DataLoader(
    tensors,
    batch_size=None,  # no automatic batching: the sampler's items are whole batches of indices
    sampler=BatchSampler(RandomSampler(tensors, generator=g), batch_size=32, drop_last=False),
    generator=g,
)
fx, fy = next(iter(fast))
print("first batch:", tuple(fx.shape), "| labels:", fy[:8].tolist(), "...")
print("the same batch as the per-sample loader of section 7:", torch.equal(fx.cpu(), images))
assert torch.equal(fx.cpu(), images) and torch.equal(fy.cpu(), labels)
lx, ly = next(
    iter(tensor_loader(x_train, y_train, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0)))
)
assert torch.equal(lx, fx) and torch.equal(ly, fy)


# %% [markdown]
# Now the two pipelines, timed batch by batch. Work on a GPU is **asynchronous** (异步): a call queues it and
# returns at once, so before each clock reading `sync()` waits until the device has finished what was queued
# (`torch.accelerator.synchronize()`, for CUDA or MPS; on the CPU every operation has finished when it returns).


# %%
# NBVAL_IGNORE_OUTPUT
def sync():
    """Wait until the device has finished all queued work (GPU work is asynchronous)."""
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def samples_per_s(loader, n_batches):
    """Samples per second in the fastest of the loader's first `n_batches` batches: the batch least disturbed by
    other programs, so the figure shows what the pipeline itself costs."""
    times, sizes, batches = [], [], iter(loader)
    for _ in range(n_batches):
        sync()
        start = time.perf_counter()
        xb, yb = next(batches)
        xb = xb.to(device, non_blocking=True)
        sync()  # wait until the copy (and, on a GPU, the indexing) has really finished
        times.append(time.perf_counter() - start)
        sizes.append(len(yb))
    fastest = int(np.argmin(times))
    return sizes[fastest] / times[fastest]


pil_loader = DataLoader(
    train_tf, batch_size=128, shuffle=True, pin_memory=device.type == "cuda", generator=torch.Generator().manual_seed(0)
)
slow_rate = samples_per_s(pil_loader, 20)
fast_rate = samples_per_s(tensor_loader(x_train, y_train, batch_size=128, shuffle=True), 100)
print(f"per-sample PIL pipeline: {slow_rate:9,.0f} samples/s (fastest of 20 batches of 128)")
print(f"tensors in memory      : {fast_rate:9,.0f} samples/s (fastest of 100 batches), {fast_rate / slow_rate:.0f}x")
assert fast_rate > 5 * slow_rate

# %% [markdown]
# ### 8.2 Decoding and files
#
# MNIST comes as one file of raw pixels, so reading it is cheap. Most image sets instead are many compressed files
# (JPEG, PNG), one per image. Then every sample of every epoch costs opening a file, reading it, and **decoding**
# (解码) it from the compressed format into pixels. Below, the first 1000 digits are written as PNG files to
# measure each step.
#
# One trap first: `PIL.Image.open` does not decode. It reads the file's header and returns at once; the pixels are
# decoded on first use (`img.load()`, `np.asarray(img)`, a transform). So timing `Image.open` alone measures
# almost nothing. PIL keeps the pending decoding work in `img.tile`:

# %%
png_dir = RUN_DIR / "png"
png_dir.mkdir()
n_files = 1000
for i in range(n_files):
    Image.fromarray(train_set.data[i].numpy()).save(png_dir / f"{i:05d}.png")
np.save(RUN_DIR / "digits.npy", train_set.data[:n_files].numpy())  # the same pixels, decoded, in one file
file_sizes = [p.stat().st_size for p in png_dir.iterdir()]
print(f"{len(file_sizes)} PNG files of {min(file_sizes)} to {max(file_sizes)} bytes (784 pixels each)")
img = Image.open(png_dir / "00000.png")
print("after Image.open:", len(img.tile), "decoding job pending, codec", repr(img.tile[0][0]))
img.load()
print("after img.load():", len(img.tile), "pending")
assert len(file_sizes) == n_files and np.array_equal(np.asarray(img), train_set.data[0].numpy())


# %%
# NBVAL_IGNORE_OUTPUT
def microseconds_per_image(read_all, repeats=3):
    """The best of `repeats` timings of `read_all()`, per image."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        read_all()
        best = min(best, time.perf_counter() - start)
    return best / n_files * 1e6


paths = [png_dir / f"{i:05d}.png" for i in range(n_files)]
blobs = [p.read_bytes() for p in paths]  # the files' bytes, kept in memory
costs = {
    "Image.open only (nothing decoded!)": lambda: [Image.open(io.BytesIO(b)) for b in blobs],
    "decode PNG bytes in memory: PIL": lambda: [np.asarray(Image.open(io.BytesIO(b))) for b in blobs],
    "open and read one file per image": lambda: [p.read_bytes() for p in paths],
    "open, read and decode one file per image": lambda: [np.asarray(Image.open(p)) for p in paths],
    "decoded pixels, one .npy file for all": lambda: np.load(RUN_DIR / "digits.npy"),
    "decoded pixels, a tensor in memory": lambda: [x_train[i] for i in range(n_files)],
}
costs = {name: microseconds_per_image(read_all) for name, read_all in costs.items()}
for name, us in costs.items():
    print(f"{name:44} {us:8.2f} µs per image")
assert costs["Image.open only (nothing decoded!)"] < costs["decode PNG bytes in memory: PIL"]
assert 5 * costs["decoded pixels, one .npy file for all"] < costs["open, read and decode one file per image"]

# %% [markdown]
# Here the files sit in the operating system's page cache, in memory, so opening one costs microseconds. On a
# spinning disk (a seek per file, milliseconds) or a network file system (a round trip per file) one open costs
# milliseconds, and 60,000 files cost minutes per epoch; that is not measured here. And a JPEG photo of a few
# hundred pixels a side takes milliseconds to decode, not microseconds. What people do about it, from the
# simplest:
#
# * decode once and keep the pixels, resized if needed, as arrays or tensors: in memory as in this notebook, or in
#   one file read in one go or memory-mapped (`np.load(path, mmap_mode="r")`; notebook 06 shows `torch.load` with
#   `mmap=True`);
# * pack many small files into a few large **shards** (分片) read from start to end: tar files (the WebDataset
#   format), LMDB, HDF5;
# * decode on the GPU: the TorchCodec library decodes JPEGs with CUDA (`torchcodec.decoders.decode_jpeg(...,
#   device="cuda")`; its decoders replace those of `torchvision.io`, deprecated since torchvision 0.29), and NVIDIA
#   DALI runs the whole pipeline (decoding, resizing, augmenting) on the GPU;
# * hide what remains: worker processes decode while the model trains (section 5; notebook 11 measures the
#   speed-up), and a local SSD beats a spinning disk or a network share.

# %% [markdown]
# ## 9. Where tensors live: CPU or GPU
#
# * `model.to(device)` moves the module's parameters **in place** and returns the same module;
# * `tensor.to(device)` returns a **new** tensor on that device (or the same one if it is already there), so
#   write `x = x.to(device)`;
# * model and inputs must be on the same device, otherwise PyTorch raises a `RuntimeError`.
#
# Pick the device once (`get_device()`), never write `"cuda"` into the code. When the data does not fit on the
# GPU, keep it on the CPU in **pinned** (page-locked) memory: host memory, not GPU memory, but memory the GPU can
# copy from directly. Then `x.to(device, non_blocking=True)` overlaps the copy with computation.
# `DataLoader(pin_memory=True)` does the pinning; the copy is then `xb.to(device, non_blocking=True)`.

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
    nn.Linear(4, 2)(torch.ones(1, 4, device="meta"))  # "meta": a device without data (notebook 06), handy here
except RuntimeError as err:
    print(type(err).__name__ + ":", err)
if device.type == "cuda":
    pinned = torch.ones(1024).pin_memory()
    assert pinned.is_pinned() and pinned.to(device, non_blocking=True).device.type == "cuda"
    print("pinned host memory + non_blocking copy: done")
else:
    print("pinned host memory + non_blocking copy: only useful with a CUDA device (this run uses the CPU)")

# %% [markdown]
# ## 10. Convolutions, layers and two classic MNIST models
#
# ### 10.1 What a convolution computes
#
# A 2-D convolution slides a small **convolution kernel** (卷积核), e.g. 3×3 numbers, over the image; at each
# position it multiplies the kernel with the patch under it, element by element, and sums: one output number per
# position. (Deep learning's "convolution" does not flip the kernel: it is a cross-correlation.) A few settings
# decide the output size:
#
# * **kernel size** $k$; **stride** (步长) $s$, how far the kernel moves per step; **padding** (填充) $p$, zeros added
#   around the border; **dilation** (膨胀) $d$, the spacing between the kernel's taps (1: adjacent pixels). For an input of
#   size $n$ the output has
#   $$\left\lfloor \frac{n + 2p - d(k-1) - 1}{s} \right\rfloor + 1$$
#   positions per side, which for $d = 1$ is $\lfloor (n + 2p - k)/s \rfloor + 1$ (a 3×3 kernel with stride 1 and no
#   padding turns 28 into 26).
# * **channels** (通道): a `Conv2d(c_in, c_out, k)` has `c_out` kernels, each of shape `c_in × k × k`; each output channel
#   sums over all input channels. Its parameters are $c_{out} \cdot c_{in} \cdot k^2$ weights plus $c_{out}$ biases.
# * **weight sharing** (权重共享): the same kernel is used at every position, so the parameter count does not depend on the
#   image size, and a pattern is detected wherever it appears.
# * **pooling** (池化): `MaxPool2d(2)` keeps the largest value of each 2×2 block (kernel 2, stride 2: the same
#   formula halves 26 to 13, rounding down 11 to 5).

# %%
image = torch.arange(25.0).view(1, 1, 5, 5)
kernel = torch.tensor([[[[1.0, 0.0, -1.0]] * 3]])  # 3x3, responds to left-right changes
out = F.conv2d(image, kernel)
by_hand = torch.tensor([[(image[0, 0, i : i + 3, j : j + 3] * kernel[0, 0]).sum() for j in range(3)] for i in range(3)])
print("input 5x5 -> output", tuple(out.shape[-2:]), "| by hand:", by_hand.tolist())
assert torch.equal(out[0, 0], by_hand)


def conv_out(n, k, s=1, p=0, d=1):
    """Output size of a convolution or pooling along one side."""
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


for k, s_, p_, d_ in [(3, 1, 0, 1), (3, 1, 1, 1), (3, 2, 1, 1), (2, 2, 0, 1), (3, 1, 0, 2)]:
    got = F.conv2d(torch.zeros(1, 1, 28, 28), torch.zeros(1, 1, k, k), stride=s_, padding=p_, dilation=d_).shape[-1]
    print(f"n=28, k={k}, s={s_}, p={p_}, d={d_}: formula {conv_out(28, k, s_, p_, d_)}, conv2d gives {got}")
    assert got == conv_out(28, k, s_, p_, d_)
conv = nn.Conv2d(1, 32, 3)
print("Conv2d(1, 32, 3) parameters:", sum(q.numel() for q in conv.parameters()), "= 32*1*3*3 + 32, for any image size")
assert sum(q.numel() for q in conv.parameters()) == 32 * 1 * 3 * 3 + 32

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
# **Why small kernels, stacked.** One output value of a 3×3 convolution sees a 3×3 patch of its input: its
# **receptive field** (感受野). A second 3×3 convolution on top sees 3×3 values of the first, which together cover
# 5×5 input pixels; three see 7×7. Two stacked 3×3 layers cover what one 5×5 layer covers, with 2·9 = 18 instead of
# 25 weights per pair of channels and a non-linearity in between, which is why CNNs stack small kernels (a pooling
# by 2 in between doubles how fast the field grows). Autograd shows the field: the gradient of one output value
# with respect to the input is non-zero exactly on the pixels it depends on.

# %%
x = torch.zeros(1, 1, 11, 11, requires_grad=True)
two_layers = nn.Sequential(nn.Conv2d(1, 1, 3), nn.Conv2d(1, 1, 3))  # nn.Sequential: section 10.2
for conv_layer in two_layers:  # nn.init: functions that fill a parameter in place
    nn.init.ones_(conv_layer.weight)  # all-ones kernels: no weight is zero by chance
two_layers(x)[0, 0, 3, 3].backward()  # one value of the 7x7 output
seen = x.grad[0, 0] != 0
rows, cols = seen.any(dim=1).nonzero().squeeze(1).tolist(), seen.any(dim=0).nonzero().squeeze(1).tolist()
print(f"output (3, 3) after two 3x3 convolutions depends on input rows {rows} and columns {cols}: 5x5 pixels")
assert seen.sum() == 25 and rows == cols == [3, 4, 5, 6, 7]

# %% [markdown]
# ### 10.2 Layers as modules or as functions
#
# Every layer exists twice in PyTorch. `nn.Conv2d(1, 32, 3)` is a **module** (模块): an object that creates its
# parameters (`weight`, `bias`), holds them, and applies them when called. `F.conv2d(x, weight, bias)` (from
# `torch.nn.functional`, imported as `F`) is a plain function that holds nothing: you pass the parameters in. A
# module's `forward` calls the function; `nn.ReLU`'s, for example, is one line:

# %%
conv = nn.Conv2d(1, 32, 3)
x = torch.randn(2, 1, 28, 28)
print("nn.Conv2d(1, 32, 3) holds:", [(name, tuple(p.shape)) for name, p in conv.named_parameters()])
assert torch.equal(conv(x), F.conv2d(x, conv.weight, conv.bias))  # the module = the function + its parameters
print("nn.ReLU.forward:", inspect.getsource(nn.ReLU.forward).strip().splitlines()[-1].strip())
assert torch.equal(nn.ReLU()(x), F.relu(x))

# %% [markdown]
# So use a module for anything with parameters or state: the model then **registers** it, so `model.parameters()`
# finds its parameters for the optimizer, `model.to(device)` moves them and `state_dict()` saves them, and forward
# hooks see the layer. Stateless steps can be either: a function (`F.relu`, `F.max_pool2d`, `torch.flatten`) or its
# module twin (`nn.ReLU`, `nn.MaxPool2d`, `nn.Flatten`), which you need inside an `nn.Sequential` (a module that
# calls its sub-modules in order) or to see the step in a hook. The models below use both styles.
#
# A model of your own is a subclass of `nn.Module`: `__init__` calls `super().__init__()` first and then creates
# the layers as attributes (assigning a module to an attribute registers it), and `forward(x)` says how to apply
# them; `model(x)` runs `forward`, with any hooks. Notebook 10 shows what happens inside. `forward` decides the
# order, not `__init__`, and it may call one module twice: both calls then use **the same parameters**, and their
# gradient is the sum of what each use contributes (as for any tensor used twice, notebook 02). That is how weight
# sharing is written, e.g. one encoder applied to two inputs; for two independent layers, create two modules.


# %%
class TwiceLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(F.relu(self.linear(x)))  # the same layer, called twice


torch.manual_seed(0)
twice = TwiceLinear()
x = torch.randn(3, 4)
twice(x).sum().backward()
# the same computation with two separate copies of the parameters, one per use (F.linear(x, w, b) = x @ w.T + b):
w1, b1, w2, b2 = [p.detach().clone().requires_grad_() for p in (*twice.linear.parameters(), *twice.linear.parameters())]
F.linear(F.relu(F.linear(x, w1, b1)), w2, b2).sum().backward()
print(f"parameters: {sum(p.numel() for p in twice.parameters())} (one Linear(4, 4): 16 + 4)")
print(
    "its weight's gradient is the sum of both uses' gradients:",
    torch.allclose(twice.linear.weight.grad, w1.grad + w2.grad),
)
assert torch.allclose(twice.linear.weight.grad, w1.grad + w2.grad) and torch.allclose(
    twice.linear.bias.grad, b1.grad + b2.grad
)

# %% [markdown]
# ### 10.3 Two classic MNIST models, layer by layer with forward hooks
#
# `Net` and `CNNnet` below are two classic small MNIST models. Between the convolutions and the linear layers,
# `torch.flatten(x, 1)` merges all dimensions from dimension 1 on (`start_dim=1`, up to `end_dim=-1`) into one:
# `[N, 64, 3, 3]` becomes `[N, 576]`, one row of features per image; `torch.flatten(x)` (`start_dim=0`) would merge
# the batch too. `nn.Flatten()` is the module twin, with `start_dim=1`. `Net`'s last line applies a softmax, which
# section 11 explains and `Net(softmax=False)` leaves out; `CNNnet` has **dropout** (丢弃法) layers, which zero
# random values during training (section 13).

# %% tags=["shared"]
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):  # `softmax=True` applies a softmax to the output, a bug: see section 11
    def __init__(self, softmax=True):
        super().__init__()
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


class CNNnet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout2d(0.25)  # on [N, 64, 12, 12] feature maps: drops whole channels
        self.dropout2 = nn.Dropout(0.5)  # on a flat [N, 128] tensor: drops single values
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


with torch.device("meta"):  # built without data (section 9): no memory, no random numbers drawn
    assert sum(p.numel() for p in Net().parameters()) == 93_322
    assert sum(p.numel() for p in CNNnet().parameters()) == 1_199_882


# %% [markdown]
# First the shapes, predicted with section 10.1's formula. Then a **forward hook** (notebook 03) on every layer
# prints what it returns. Printing `x.shape` after every line of `forward` would do the same, but it clutters every
# later call and must be deleted again; hooks work from outside, on any model, and are removed afterwards. Hooks
# see modules, so the `F.relu` and `F.max_pool2d` calls do not appear; their effect shows in the next layer's
# shape.

# %%
# Net:    28 -conv3-> 26 -pool-> 13 -conv3-> 11 -pool-> 5 -conv3-> 3, with 64 channels
# CNNnet: 28 -conv3-> 26 -conv3-> 24 -pool-> 12, with 64 channels
side_net = conv_out(conv_out(conv_out(conv_out(conv_out(28, 3), 2, 2), 3), 2, 2), 3)
side_cnn = conv_out(conv_out(conv_out(28, 3), 3), 2, 2)
predicted = {"Net flatten": 64 * side_net**2, "CNNnet flatten": 64 * side_cnn**2}
print("predicted flattened sizes:", predicted)
assert predicted == {"Net flatten": 576, "CNNnet flatten": 9216}
t = torch.zeros(100, 64, 3, 3)
print(
    f"torch.flatten(t, 1): {list(torch.flatten(t, 1).shape)} | torch.flatten(t): {list(torch.flatten(t).shape)} | "
    f"t.flatten(2): {list(t.flatten(2).shape)} | nn.Flatten()(t): {list(nn.Flatten()(t).shape)}"
)


def shape_report(model, x):
    """Print each named leaf module's output shape (via forward hooks) and the parameter count."""
    # A forward hook is called as hook(module, inputs, output); name=name binds this loop's name now, since a plain
    # lambda would read `name` only when called, after the loop has ended.
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


random_data = torch.rand(100, 1, 28, 28)  # [N, C, H, W] = 100 grey 28x28 images
net, cnn = Net().eval(), CNNnet().eval()  # eval mode: Dropout off (section 13)
print("Net:")
_, n_net = shape_report(net, random_data)
print("CNNnet:")
out, n_cnn = shape_report(cnn, random_data)
assert out.shape == (100, 10) and (n_net, n_cnn) == (93_322, 1_199_882) and n_cnn / n_net > 12.8
assert (net.dense1.in_features, cnn.fc1.in_features) == (predicted["Net flatten"], predicted["CNNnet flatten"])
# _forward_hooks is a private attribute (the module's registered forward hooks), read here only to check
assert not any(m._forward_hooks for m in [*net.modules(), *cnn.modules()]), "the hooks were removed"

# %% [markdown]
# Which dropout where: `nn.Dropout2d` zeroes whole *channels* of a `[N, C, H, W]` feature map (neighbouring pixels
# are so alike that dropping single ones would hide little); on a flat `[N, features]` vector, such as after `fc1`,
# use `nn.Dropout`. A `Dropout2d` there is a common slip, which PyTorch warns about. Note also where `CNNnet`'s
# 1.2 million parameters are: 98 % of them in `fc1` (9216 × 128), because it flattens a large 12×12×64 map. `Net`
# pools more and needs 13 times fewer.

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
# ## 11. Softmax, cross-entropy, and a softmax too many
#
# A classifier's last layer returns one score per class, any real numbers: **logits** (未归一化的对数几率). The
# **softmax** (softmax 函数) turns them into probabilities, positive and summing to 1, the largest score getting the
# largest probability:
# $$p_i = \frac{e^{z_i}}{\sum_j e^{z_j}}.$$
# Adding the same number to every logit changes nothing. To train, we want the probability of the right class $y$
# to be high. The **cross-entropy** (交叉熵) loss is $-\log p_y$, the **negative log-likelihood** (负对数似然, NLL)
# of the right class: 0 when $p_y = 1$, large when $p_y$ is small. Written with the logits,
# $-\log p_y = -z_y + \log \sum_j e^{z_j}$: a `log_softmax` ($\log p$ for every class), then picking the right class's
# entry and negating it (`nll_loss`). A **one-hot** (独热) vector writes the label as probabilities: 1 for the right
# class, 0 for the others.
#
# `nn.CrossEntropyLoss` (and the function `F.cross_entropy`) therefore takes **logits** and does both steps itself.
# It computes `log_softmax` as $z_i - \log \sum_j e^{z_j}$, subtracting the largest logit first so that nothing
# overflows; `softmax(z).log()` instead rounds a tiny probability to 0 and its log to $-\infty$:

# %%
z = torch.tensor([[2.0, 1.0, -1.0]])  # logits of one sample, 3 classes
p = torch.exp(z) / torch.exp(z).sum(dim=1, keepdim=True)
print("softmax by hand:", [round(v, 4) for v in p[0].tolist()], "| sum", round(p.sum().item(), 4))
assert torch.allclose(p, F.softmax(z, dim=1)) and torch.allclose(F.softmax(z + 100, dim=1), p)
y = torch.tensor([0])  # the right class
losses = {
    "-log p[y] by hand": -torch.log(p[0, y[0]]).item(),
    "nll_loss(log_softmax(z), y)": F.nll_loss(F.log_softmax(z, dim=1), y).item(),
    "cross_entropy(z, y)": F.cross_entropy(z, y).item(),
    # F.one_hot(y, 3): each class index as a row of 3 with a 1 at that index
    "cross_entropy(z, one-hot)": F.cross_entropy(z, F.one_hot(y, 3).float()).item(),  # probabilities as target
}
for name, value in losses.items():
    print(f"  {name:28} {value:.4f}")
assert max(losses.values()) - min(losses.values()) < 1e-6
big = torch.tensor([[200.0, 0.0, -200.0]])
print(
    "softmax(z).log():",
    F.softmax(big, dim=1).log()[0].tolist(),
    "| log_softmax(z):",
    (F.log_softmax(big, dim=1)[0] + 0.0).tolist(),
)
assert torch.isinf(F.softmax(big, dim=1).log()).any() and torch.isfinite(F.log_softmax(big, dim=1)).all()

# %% [markdown]
# **The bug: a softmax before `CrossEntropyLoss`.** `Net(softmax=True)` returns `softmax(x)`, a mistake common in
# older code and tutorials, and trains it with `CrossEntropyLoss`, which applies a second softmax, now to numbers
# in [0, 1]. Two consequences:
#
# * the loss can never get small: even a perfect output `[1, 0, …, 0]` gives logits that differ by at most 1, and
#   a loss of $\log(1 + 9/e) \approx 1.46$;
# * the gradients shrink: the extra softmax multiplies them by factors $p(1-p) \le 1/4$, about $0.1 \cdot 0.9$
#   while all ten outputs are near 0.1, so learning starts slowly.
#
# Return logits from `forward`; apply `softmax` only when you want probabilities, for display.

# %%
perfect = F.one_hot(torch.tensor([3]), 10).float()  # the best a softmax output can ever be
floor = F.cross_entropy(perfect, torch.tensor([3])).item()
print(f"loss floor after a softmax: {floor:.4f} = log(1 + 9/e)")
assert abs(floor - np.log(1 + 9 / np.e)) < 1e-6
grad_norms = {}
for softmax in (False, True):
    torch.manual_seed(0)  # the same initial weights for both models
    net = Net(softmax=softmax).to(device)
    F.cross_entropy(net(x_train[:64]), y_train[:64]).backward()
    grad_norms[softmax] = torch.cat([p.grad.flatten() for p in net.parameters()]).norm().item()
ratio = grad_norms[False] / grad_norms[True]
print(f"at the same initial weights, the gradient is {ratio:.0f} times smaller with the extra softmax")
assert ratio > 5

# %% [markdown]
# A short run shows both effects: the same `Net`, the same initial weights and the same 120 batches of 32 training
# images, with and without the final softmax. The optimizer is SGD with **momentum** (动量) 0.9, as in the original
# recipe, but with a larger learning rate (0.02 instead of 0.001). Momentum keeps a decaying sum of past gradients,
# b ← 0.9·b + g, and steps along it, so that steps in a consistent direction build up speed (notebook 10 covers
# optimizers in full). The numbers vary a little between machines, so the cell prints what it measured and asserts
# what holds everywhere.


# %%
# NBVAL_IGNORE_OUTPUT
def short_run(softmax, steps=120, batch_size=32):
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
    {"softmax + CrossEntropyLoss": losses_sm, "logits + CrossEntropyLoss": losses_lg},
    xlabel="step",
    ylabel="training loss",
    title="Net, 120 steps of 32 images",
)
fig.axes[0].axhline(floor, color="gray", ls="--", lw=1, label="floor with the softmax: 1.46")
fig.axes[0].set_ylim(0, 3.5)
fig.axes[0].legend(loc="upper right", fontsize=8)
plt.show()
for name, run, acc in (("softmax", losses_sm, acc_sm), ("logits ", losses_lg, acc_lg)):
    print(
        f"{name}: mean loss of steps 1-20 {np.mean(run[:20]):.2f}, of steps 101-120 {np.mean(run[-20:]):.2f}; "
        f"test accuracy {acc:.0%}"
    )
assert np.mean(losses_sm[:40]) > 2.25 and np.mean(losses_sm[-20:]) < 2.2  # a slow start, but not stuck
assert np.mean(losses_lg[-20:]) < 0.6 < floor and acc_lg > acc_sm + 0.1

# %% [markdown]
# ## 12. The course model and one training step by hand
#
# The course model is a lean CNN in the spirit of `Net`, built to train fast on a CPU:
#
# * three 3×3 convolutions with 16, 32 and 64 channels, each followed by **batch normalisation** (批归一化,
#   `BatchNorm2d`). In training, BatchNorm rescales each channel to mean 0 and variance 1 over the batch, then applies
#   a learned scale $\gamma$ and shift $\beta$ per channel: each layer gets inputs of a steady scale however the
#   weights before it change, which allows a large **learning rate** (学习率). (Section 13 shows what it does at
#   evaluation time.) The convolutions have no bias because BatchNorm's shift plays that role;
# * max-pooling *before* BatchNorm and ReLU, so those run on maps four times smaller. Pooling and ReLU commute (ReLU
#   never changes which value is largest), but pooling and BatchNorm do **not**: BatchNorm computes its statistics
#   over the values it is given (the pooled maps here, not the full ones), and a negative $\gamma$ turns maxima into
#   minima. So this is a different model from conv → BN → ReLU → pool, chosen for speed, not an equivalent rewrite
#   (both facts are checked below);
# * a single linear layer that returns **logits**: 29 178 parameters, a third of `Net`'s;
# * the **channels-last** memory format (`model.to(memory_format=torch.channels_last)`): feature maps are stored as
#   `[N, H, W, C]` in memory (the shape stays `[N, C, H, W]`), which many CPUs' vectorised convolution kernels
#   prefer (here a "kernel" is a compiled routine that computes one operation, not a convolution's weights).
#   Which layout is faster depends on the CPU and the library's kernels; section 13 measures both on yours.
#   The input has one channel, so it needs no conversion.
#
# It is written with `nn.Sequential`, given an `OrderedDict` so that the blocks have names, `nn.Flatten`, and
# `nn.ReLU(inplace=True)`, which overwrites its input instead of allocating a new tensor.

# %% tags=["shared"]
from collections import OrderedDict

import torch  # imported again: this cell imports what it needs, so it can be copied and run on its own
from torch import nn


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


with torch.device("meta"):  # built without data (section 9)
    assert sum(p.numel() for p in course_model().parameters()) == 29_178


# %% [markdown]
# One training step is five lines: clear the old gradients, forward, loss, backward, update. The optimizer here is
# **AdamW**, a variant of **Adam** (自适应矩估计). Plain SGD steps along the gradient itself; Adam keeps, for every
# parameter, a running average of its gradient (weighted by β1) and of the gradient's square (weighted by β2) and
# steps along the first divided by the square root of the second, so each parameter moves by about the learning
# rate whatever the scale of its gradients. AdamW applies weight decay apart from that scaling. Notebook 10 covers
# optimizers in full.

# %%
z = torch.randn(2, 3, 6, 6)
assert torch.equal(F.max_pool2d(F.relu(z), 2), F.relu(F.max_pool2d(z, 2)))  # pooling and ReLU commute
bn = nn.BatchNorm2d(3)  # train mode: normalises with the statistics of the batch it is given
gap = (bn(F.max_pool2d(z, 2)) - F.max_pool2d(bn(z), 2)).abs().max().item()
print(f"pool then BatchNorm vs BatchNorm then pool: largest difference {gap:.1f}")
assert gap > 0.1  # BatchNorm and pooling do not commute
torch.manual_seed(0)
model = course_model().to(device)
_, n_course = shape_report(model.eval(), x_train[:100])  # eval mode: BatchNorm's running statistics (section 13)
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
# A training run repeats the five-line step over the whole **training set** (训练集), once per **epoch** (轮次),
# and after every few hundred steps measures the model on data it does not train on. Three pieces appear here for
# the first time:
#
# * A **validation set** (验证集). The **test set** (测试集) must be used *once*, at the end, for the accuracy we
#   report: if we looked at it after every epoch to choose the number of epochs or the learning rate, the reported
#   number would be tuned to it and no longer an honest estimate. So we hold out 5,000 of the 60,000 training
#   images (a seeded random split) to watch during training, and train on the other 55,000.
# * **`model.train()` and `model.eval()`.** They set a flag that a few layers read. In train mode `BatchNorm2d`
#   normalises with the mean and variance of the current batch and updates its running averages of both; in eval
#   mode it uses those running averages, so a prediction does not depend on the other images in the batch.
#   `Dropout` zeroes a random fraction $p$ of the values in train mode and scales the rest by $1/(1-p)$; in eval mode
#   it does nothing. Forgetting `eval()` gives noisy, batch-dependent predictions; forgetting `train()` afterwards
#   trains without them.
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
# The recipe. Of its choices, the two that matter most are the optimizer, AdamW, and its one-cycle learning-rate
# schedule; the others are refinements.
#
# * **batch 128** from the tensors in memory: 430 steps per epoch over the 55,000 training images;
# * **AdamW** with a **one-cycle schedule** (单周期学习率策略, `OneCycleLR`): the learning rate warms up from 0.0008 to 0.02 over the
#   first 30 % of the steps, then anneals to almost zero; `scheduler.step()` runs after every batch. One-cycle also
#   moves Adam's β1, the other way (its `cycle_momentum=True` by default): from 0.95 down to 0.85 while the rate
#   rises, and back up to 0.95. It overwrites the β1 given to the optimizer, so the optimizer you configure is not
#   quite the one that runs: the code passes `betas=(0.95, 0.99)` so that the β1 written there is the one the
#   schedule starts from; `cycle_momentum=False` would keep a fixed β1. β2 = 0.99 instead of the default 0.999
#   shortens the memory of Adam's average of squared gradients from about 1/(1 − 0.999) = 1000 steps to about 100,
#   which suits a run of 430 steps. `weight_decay=1e-4` pulls every weight slightly towards 0
#   (notebook 10 shows why BatchNorm's parameters and biases are often exempted);
# * `fused=True` computes AdamW's whole update for a parameter tensor in one fused kernel, instead of a series of
#   separate tensor operations: on the CPU one such kernel per parameter tensor, on CUDA a few kernels that each
#   handle many tensors;
# * **one epoch**, with the validation set measured four times during it (every 108 steps), so the curves have
#   more than one point;
# * the loss is cross-entropy on the logits, with **label smoothing** (标签平滑,
#   `CrossEntropyLoss(label_smoothing=0.1)`): the target puts 0.91 on the true digit and 0.01 on each of the nine
#   others instead of 1 and 0, so the model is not pushed towards ever larger logits on images it already gets
#   right. The loss can then no longer reach 0: its floor is the entropy of that target, about 0.50 (computed below).
#
# The whole loop is two functions. `train_steps` runs the five-line step on each batch it is given (here a quarter
# of an epoch at a time) and returns the mean loss and accuracy over those batches, weighting each batch by its
# size since the last one is smaller, and every step's loss for the curves. `evaluate` does the same in eval mode
# without gradients.

# %% tags=["shared"]
import torch
from torch import nn

loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)


def train_steps(model, batches, optimizer, scheduler):
    """Train on `batches`; return the mean loss and accuracy over them, and the loss of every step."""
    check_optimizer(model, optimizer)  # a guard (next cell)
    model.train()  # BatchNorm: batch statistics; Dropout: on
    loss_sum, correct, seen, step_losses = 0.0, 0, 0, []
    for i, batch in enumerate(batches):
        xb, yb = check_batch(batch, i, "batches")  # a guard (next cell)
        optimizer.zero_grad()  # 1. clear the old gradients
        logits = model(xb)  # 2. forward
        loss = loss_fn(logits, yb)  # 3. the mean loss over the batch
        value = loss.item()
        check_finite(value, xb, model, f"training step {scheduler.last_epoch + 1} (batch {i} of this call)")  # a guard
        loss.backward()  # 4. gradients
        optimizer.step()  # 5. update
        scheduler.step()  # one-cycle: a new learning rate every step
        step_losses.append(value)
        loss_sum += value * len(yb)
        correct += (logits.argmax(dim=1) == yb).sum().item()
        seen += len(yb)
    check_seen(seen, "batches")  # a guard
    return loss_sum / seen, correct / seen, step_losses


@torch.no_grad()  # no graph: evaluation never calls backward
def evaluate(model, loader):
    """The mean loss and the accuracy over all the batches of `loader`."""
    model.eval()  # BatchNorm: running statistics; Dropout: off
    loss_sum, correct, seen = 0.0, 0, 0
    for i, batch in enumerate(loader):
        xb, yb = check_batch(batch, i, "loader")
        logits = model(xb)
        loss = loss_fn(logits, yb).item()
        check_finite(loss, xb, model, f"evaluation batch {i}")  # NaN logits still have an argmax
        loss_sum += loss * len(yb)
        correct += (logits.argmax(dim=1) == yb).sum().item()
        seen += len(yb)
    check_seen(seen, "loader")
    return loss_sum / seen, correct / seen


assert loss_fn.label_smoothing == 0.1

# %% [markdown]
# `loss.item()` copies one number to the CPU at every step; on a GPU that waits until the forward pass has
# finished, which costs little at this size (a loop that must not wait would add up the loss on the device and
# read it once per check). Two guards are good practice in any loop, and the functions above call them:
#
# * `check_finite` stops at the first batch whose loss is NaN or infinite, names it, and says what is to blame, its
#   input or the model. In training it runs before `backward()`, which would carry the NaN into every gradient and
#   the optimizer into every weight (the forward pass has already added the batch to BatchNorm's running averages,
#   which hold NaN from then on: rebuild the model). In evaluation it runs because NaN logits still have an
#   `argmax`, so an accuracy would come out of them.
# * `check_optimizer` refuses an optimizer that holds parameters of another model. That is what you get by
#   re-running the cell that builds the model but not the one that builds the optimizer: training then runs without
#   an error while the new model's weights never change.
#
# Two smaller ones turn a confusing error into a plain one: `check_batch` refuses a batch that is not a pair
# `(images, labels)` (a dataset that also returns, say, an index), and `check_seen` a loader that yielded nothing
# (an empty dataset, or an iterator already used up), which would otherwise end in a division by zero.

# %% tags=["shared"]
import math

import torch


def check_optimizer(model, optimizer):
    """Refuse an optimizer that updates tensors which are not this model's parameters."""
    ours = {id(p) for p in model.parameters()}
    if any(id(p) not in ours for group in optimizer.param_groups for p in group["params"]):
        raise ValueError(
            "the optimizer holds parameters that are not this model's, so training would never change "
            "it: build the optimizer again from model.parameters(), and the scheduler from that optimizer"
        )


def check_batch(batch, i, name):
    """A batch as the pair `(inputs, labels)`; anything else is refused, naming the argument it came from."""
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        size = f" of {len(batch)} items" if isinstance(batch, (tuple, list)) else ""
        raise ValueError(
            f"batch {i} of {name} is a {type(batch).__name__}{size}; each batch must be a pair (inputs, labels): "
            "give a DataLoader over a dataset whose items are (image, label)"
        )
    return batch


def check_seen(seen, name):
    """Refuse a loader that yielded no example: the mean loss and the accuracy of nothing are undefined."""
    if seen == 0:
        raise ValueError(f"{name} yielded no batch: is its dataset empty, or was the iterator already used up?")


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


assert check_finite(0.5, None, None, "a finite loss") is None  # passes without looking at the batch or the model


# %% [markdown]
# The split, and the floor of the label-smoothed loss:

# %%
split = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(0)).to(device)
train_idx, val_idx = split[5_000:], split[:5_000]
print(f"training images: {len(train_idx):,} | validation images: {len(val_idx):,} | test images: {len(x_test):,}")
assert len(torch.unique(split)) == 60_000  # a partition: no image in both parts

smoothed = torch.full((10,), 0.01)
smoothed[3] = 0.91  # the target of an image of a 3
entropy = -(smoothed * smoothed.log()).sum()
print(f"smoothed target sums to {smoothed.sum():.2f}; loss floor = its entropy = {entropy:.2f}")
assert loss_fn.label_smoothing == 0.1 and abs(loss_fn(smoothed.log()[None], torch.tensor([3])) - entropy) < 1e-6

# %% [markdown]
# One NaN pixel, in the second of two batches, with section 12's model:

# %%
images_nan = x_train[:256].clone()
images_nan[200, 0, 14, 14] = float("nan")
try:
    evaluate(model, [(images_nan[:128], y_train[:128]), (images_nan[128:], y_train[128:256])])
except FloatingPointError as err:
    stopped = err
    print(type(err).__name__ + ":", err)
with torch.no_grad():
    nan_images = int(model(images_nan[128:]).isnan().any(dim=1).sum())  # eval mode: the NaN stays in its own image
print("images of that batch with NaN logits:", nan_images)
assert nan_images == 1 and str(stopped).startswith("evaluation batch 1: the loss is nan; its input holds 1 NaN")

# %% [markdown]
# Now the run. `SummaryWriter` (TensorBoard, section 15) logs the metrics at each validation check, against the
# step number `scheduler.last_epoch`: despite its name, it counts the scheduler's `step()` calls, and ours is
# stepped after every batch, so it counts training steps, not epochs. The cell prints a line at each check; the
# numbers differ in the last digits between machines (and thread counts), so the cell asserts what holds
# everywhere, and the cells after it print it. The stored outputs were made with one thread; by default PyTorch
# uses one thread per core (`torch.get_num_threads()`), and on an otherwise idle machine that trains faster. (When
# other programs keep the cores busy, more threads than free cores can be much slower than one:
# `torch.set_num_threads(1)` is then the fix.)

# %%
# NBVAL_IGNORE_OUTPUT
seed_everything(0)
model = course_model().to(device)
EPOCHS, CHECKS, BATCH, MAX_LR = 1, 4, 128, 0.02
train_loader = tensor_loader(
    x_train[train_idx], y_train[train_idx], batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0)
)
val_loader = tensor_loader(x_train[val_idx], y_train[val_idx], batch_size=1000)
optimizer = torch.optim.AdamW(
    model.parameters(), lr=MAX_LR, betas=(0.95, 0.99), weight_decay=1e-4, fused=device.type in ("cpu", "cuda")
)
total_steps = EPOCHS * len(train_loader)
steps_per_check = -(-total_steps // CHECKS)  # rounded up: 108, 108, 108 and the last 106 steps
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=MAX_LR, total_steps=total_steps)
writer = SummaryWriter(str(RUN_DIR / "tensorboard"))

history = {key: [] for key in ("step", "train_loss", "train_acc", "val_loss", "val_acc", "seconds", "cpu_seconds")}
step_losses = []
batches = (batch for _ in range(EPOCHS) for batch in train_loader)  # every batch of every epoch, in order
print(f"{total_steps} steps, a validation check every {steps_per_check}:")
for check in range(CHECKS):
    start, cpu_start = time.perf_counter(), time.process_time()
    train_loss, train_acc, losses = train_steps(model, itertools.islice(batches, steps_per_check), optimizer, scheduler)
    history["seconds"].append(time.perf_counter() - start)
    history["cpu_seconds"].append(time.process_time() - cpu_start)
    val_loss, val_acc = evaluate(model, val_loader)
    step_losses += losses
    step = scheduler.last_epoch  # steps taken so far (the scheduler steps every batch)
    for key, value in zip(
        ("step", "train_loss", "train_acc", "val_loss", "val_acc"), (step, train_loss, train_acc, val_loss, val_acc)
    ):
        history[key].append(value)
    writer.add_scalars("loss", {"train": train_loss, "validation": val_loss}, step)
    writer.add_scalar("accuracy/train", train_acc, step)
    writer.add_scalar("accuracy/validation", val_acc, step)
    writer.add_scalar("lr", scheduler.get_last_lr()[0], step)
    print(
        f"  check {check + 1}, step {step}: mean training loss {train_loss:.3f} | validation loss {val_loss:.3f}, "
        f"accuracy {val_acc:.2%} | {history['seconds'][-1]:.1f} s",
        flush=True,
    )
assert history["step"][-1] == total_steps and history["val_acc"][-1] >= 0.985
assert history["val_loss"][0] < history["train_loss"][0] and history["val_loss"][-1] < history["val_loss"][0]

# %% [markdown]
# The schedule the run followed, replayed on a throw-away optimizer (the schedule depends only on the step), and
# the proof that one-cycle overwrites β1. To read the current rate, use `scheduler.get_last_lr()`; `get_lr()` is
# what the scheduler calls internally, and warns:

# %%
probe = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=MAX_LR, betas=(0.9, 0.99))
probe_schedule = torch.optim.lr_scheduler.OneCycleLR(probe, max_lr=MAX_LR, total_steps=total_steps)
print("betas=(0.9, 0.99) given to AdamW; after OneCycleLR(...):", probe.param_groups[0]["betas"])
lrs, beta1s = [], []
for _ in range(total_steps):
    lrs.append(probe.param_groups[0]["lr"])
    beta1s.append(probe.param_groups[0]["betas"][0])
    probe.step()  # no gradients: nothing changes but the step count
    probe_schedule.step()
peak = int(np.argmax(lrs))
print(f"learning rate: {lrs[0]:.4f} at step 1, {lrs[peak]:.4f} at step {peak + 1}, {lrs[-1]:.1e} at the last step")
print(
    f"beta1:         {beta1s[0]:.2f} at step 1, {beta1s[peak]:.2f} at step {peak + 1}, {beta1s[-1]:.2f} at the last step"
)
beta1_run = optimizer.param_groups[0]["betas"][0]
print(f"the run's optimizer ended with beta1 = {beta1_run:.2f}, as the replay; its beta2 stayed 0.99")
show_warning(scheduler.get_lr, UserWarning, "get_last_lr")
fig, ax = plt.subplots(figsize=(7, 2.8))
ax.plot(range(1, total_steps + 1), lrs, color="C0")
ax.set(xlabel="step", ylabel="learning rate", title="One-cycle: the learning rate and Adam's β1")
ax2 = ax.twinx()
ax2.plot(range(1, total_steps + 1), beta1s, color="C1")
ax2.set_ylabel("β1", color="C1")
plt.show()
assert probe.param_groups[0]["betas"] == optimizer.param_groups[0]["betas"] and scheduler.get_last_lr()[0] < 1e-5
assert optimizer.param_groups[0]["betas"][1] == 0.99
assert (beta1s[0], min(beta1s), np.argmin(beta1s)) == (0.95, beta1s[peak], peak) and abs(beta1s[peak] - 0.85) < 1e-9

# %% [markdown]
# Only now, with training finished and nothing left to choose, the **test set** is used, once. This cell prints the
# accuracies to the whole percent, which every machine agrees on; the next one prints them to two decimals, which
# differ by a few hundredths of a percent between CPUs and thread counts (the last digits of the arithmetic
# differ, and after 430 steps a few borderline digits go the other way).

# %%
test_loader = tensor_loader(x_test, y_test, batch_size=1000)
test_loss, test_acc = evaluate(model, test_loader)
print(f"validation accuracy at the last check: {history['val_acc'][-1]:.0%}")
print(f"test accuracy on {len(x_test):,} images: {test_acc:.0%}")
assert test_acc >= 0.99


# %%
# NBVAL_IGNORE_OUTPUT
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


train_seconds, cpu_seconds = sum(history["seconds"]), sum(history["cpu_seconds"])
wrong_count = int(round((1 - test_acc) * len(x_test)))
print(f"validation accuracy at the last check {history['val_acc'][-1]:.2%}")
print(f"test accuracy {test_acc:.2%} ({wrong_count} digits wrong), test loss {test_loss:.4f}")
print(
    f"training time: {train_seconds:.1f} s ({cpu_seconds:.1f} s of CPU time, "
    f"{EPOCHS * len(train_idx) / train_seconds:,.0f} images/s) on {device.type}, torch threads: {torch.get_num_threads()}"
)
if device.type == "cpu":
    t_last = cpu_seconds_per_step(course_model())
    t_first = cpu_seconds_per_step(course_model().to(memory_format=torch.contiguous_format))
    print(
        f"fastest of 8 steps: channels-last {t_last * 1000:.0f} ms, channels-first {t_first * 1000:.0f} ms of CPU time"
    )
assert 0 < train_seconds < 600 and test_acc >= 0.99

# %% [markdown]
# ## 14. Curves, confusion matrix and the digits it gets wrong
#
# The first plot shows the loss of every training step, with the mean training loss of each quarter of the epoch,
# the validation loss at the end of it, and the floor that label smoothing puts under the loss. Notice that at the
# first check the **validation loss is below the training loss**, which looks backwards. It is not: that training
# loss is the mean over the first 108 steps, and the model improved a lot during them, so the early, bad steps pull
# the mean up; the validation loss is measured once, with the model as it is at the check. And in training,
# Dropout and BatchNorm's batch statistics add noise that evaluation does not have (this model has no Dropout, but
# `CNNnet` has).

# %%
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(range(1, len(step_losses) + 1), step_losses, lw=0.5, alpha=0.6, label="training loss of each step")
ax.plot(history["step"], history["train_loss"], "o-", label="training loss, mean since the previous check")
ax.plot(history["step"], history["val_loss"], "s-", label="validation loss at the check")
ax.axhline(entropy.item(), color="gray", ls="--", lw=1, label="floor with label smoothing (0.50)")
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
print("steps logged:", len(step_losses), "| every step's loss is above the floor:", min(step_losses) > entropy.item())
print("at check 1 the validation loss is below the mean training loss; by check 4 it has fallen further")
assert len(step_losses) == total_steps and min(step_losses) > entropy.item()
assert history["val_loss"][0] < history["train_loss"][0] and history["val_loss"][-1] < history["val_loss"][0]

# %% [markdown]
# The **confusion matrix** (混淆矩阵) counts, for each true digit (row), which digit the model predicted (column);
# the diagonal holds the correct predictions, so its sum divided by 10000 is the accuracy. With 99 % right, the
# diagonal (about 1000 per digit) would swamp the colour scale, so the heat map shows the **errors only** (the
# diagonal set to zero): the darkest cells are the pairs of digits the model confuses most. The row sums are the
# number of test images of each digit.

# %%
model.eval()
with torch.no_grad():
    preds = torch.cat([model(xb).argmax(dim=1) for xb, _ in test_loader]).cpu()
targets = y_test.cpu()
# each (true, predicted) pair becomes one number 10*true + predicted, so one bincount counts all 100 pairs
confusion = torch.bincount(targets * 10 + preds, minlength=100).view(10, 10)
assert torch.equal(confusion.sum(1), torch.bincount(targets, minlength=10))  # rows: the true digits
assert confusion.trace().item() == round(test_acc * 10000)
print("test images per digit (row sums):", confusion.sum(1).tolist())
print(f"right (the diagonal): {confusion.trace().item() / 10000:.0%} of the 10,000, the test accuracy")
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
print(f"misclassified test digits: fewer than 1 % of the 10,000; the first {len(show_idx)} are shown")
assert len(wrong) == 10000 - confusion.trace().item() and len(wrong) < 100

# %% [markdown]
# What the first layer computes: a forward hook catches the 16 feature maps that `block1` returns for one test
# digit (after its convolution, pooling, BatchNorm and ReLU). Each map is one learned 3×3 kernel's response over
# the image: some light up on strokes of one direction or on the stroke's edges, some on the background.

# %%
caught = {}
handle = model.block1.register_forward_hook(lambda mod, inp, out: caught.update(block1=out.detach()))
with torch.no_grad():
    model(x_test[:1])
handle.remove()
feature_maps = caught["block1"][0].cpu()  # [16, 13, 13]
print("block1 returns", list(caught["block1"].shape), "for one image: 16 maps of 13x13")
assert feature_maps.shape == (16, 13, 13) and (feature_maps >= 0).all()  # after ReLU
plot_image_grid(feature_maps[:, None] / feature_maps.amax(dim=(1, 2), keepdim=True)[:, None].clamp(min=1e-6))
plt.show()

# %% [markdown]
# ## 15. TensorBoard
#
# The writer already holds the scalars of each validation check. We add an image (the misclassified digits), the
# model graph and a hyper-parameter record, then read the event files back with `utils.tb.read_events` to prove
# what is there.
#
# `add_graph` records the graph by *tracing* the model with `torch.jit.trace`, which PyTorch has deprecated in
# favour of `torch.compile`/`torch.export`; TensorBoard has no other way yet, so the cell prints (and checks)
# the `FutureWarning` instead of hiding it. `add_hparams` writes by default into a new sub-folder named after the
# clock; `run_name="."` keeps it in the same run folder.

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
# `add_scalars` (plural) writes each curve into its own sub-folder (`loss_train/`, `loss_validation/`), so
# TensorBoard draws them in one chart. To look at all of it, run in a notebook cell (or `tensorboard --logdir runs`
# in a terminal from the repository root):
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
logged = [v for _, v in loss_curves["loss_train"]]  # stored as float32
assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(logged, history["train_loss"], strict=True))

# %% [markdown]
# ## Exercises (练习)
#
# Four exercises, easiest first: predict, write a function, write a class, then a stretch that combines this
# notebook with notebook 02. Each has a **stub cell** that starts with `# ✏️ Exercise N`: edit it and run it. The
# **check cell** below it then says *correct*, or *not yet* with a hint and the section to re-read, or *not attempted
# yet* while the stub is untouched. The checks also look at *how* your code works where the task says so (a
# forward pass on too many samples, a second `optimizer.step()`), not only at the numbers it returns. This section
# does not depend on the lesson's cells (the checks make their own small data, and exercise 3 reads the MNIST test
# set from `data/` as section 1 does): after a kernel restart, run its first cell and go on. `make progress`
# (without make, e.g. on Windows: `python tools/course.py progress`) lists which exercises of every notebook pass.

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
# epoch, and a loader whose last batch is smaller than the others. `model.eval()` is not `torch.no_grad()`:
# section 13 says what each one does, and evaluation needs both. Evaluate batch by batch, as the loader hands them
# out: a real test set is too large for one forward pass, so do not join the batches into one.


# %%
# ✏️ Exercise 2: write the body of the function
def evaluate_classifier(model: nn.Module, loader) -> tuple[float, float]:
    raise NotImplementedError("your code here")


# %%
ex.check(2, evaluate_classifier)

# %% [markdown]
# ### Exercise 3 · A batch sampler with every digit in every batch
#
# Section 4's `WeightedRandomSampler` balances the digits only on average: a batch of 100 may hold 40 ones or 60.
# Write `EveryDigitBatches(labels, per_class, generator)`, a **batch sampler** like section 4's `PairSampler`, for
# `DataLoader(dataset, batch_sampler=...)`. `labels` is a tensor with the label of every sample of the dataset, and
# each batch it yields is a list of dataset indices with exactly `per_class` samples of *every* digit that occurs in
# `labels`. Within an epoch no index comes twice; the epoch ends when the rarest digit has fewer than `per_class`
# unused samples left (the leftovers are dropped). `len(sampler)` is the number of batches per epoch. The batches
# are random and new every epoch (section 3): which samples share a batch changes, not only the order of the
# batches. The randomness is drawn from `generator` (a `torch.Generator`), never from the global random
# generators, so that a seeded run repeats it.
#
# The check runs your sampler in a `DataLoader` over the MNIST test set, then over a part of it that holds only
# three digits, and looks at the labels of every batch. Section 4's lines `(train_set.targets == 0).nonzero().squeeze(1)`
# and `torch.randperm(10, generator=g)`, with `labels.unique()` for the digits that occur, are all the tools you
# need.


# %%
# ✏️ Exercise 3: write the methods of the class
from torch.utils.data import Sampler


class EveryDigitBatches(Sampler[list[int]]):
    def __init__(self, labels: torch.Tensor, per_class: int, generator: torch.Generator):
        raise NotImplementedError("your code here")

    def __iter__(self):
        raise NotImplementedError("your code here")

    def __len__(self):
        raise NotImplementedError("your code here")


# %%
ex.check(3, EveryDigitBatches)

# %% [markdown]
# ### Exercise 4 · Gradient accumulation (stretch)
#
# **Gradient accumulation** (梯度累加): when a batch of 64 does not fit in memory, split it into two batches of
# 32, run a forward and a backward pass on each, and step once. Write `accumulation_step(model, micro_batches,
# optimizer)`. `micro_batches` is a list of `(x, y)` pairs, not all of the same size. Make **one** call of
# `optimizer.step()` whose update is the one a single step on all of them concatenated would make, with
# `F.cross_entropy` (the mean over the samples) as the loss, and return that mean loss per sample as a float,
# computed before the update. As in a training loop, the previous step's gradients are still in `.grad` when the
# function is called. This is section 12's five-line step combined with notebook 02's section 4: `.grad` adds up
# across backward passes. The model must never see more than one micro-batch at a time, and each micro-batch's
# backward pass comes before the next one's forward pass: that way only one micro-batch's activations are ever in
# memory.
#
# A question to think about (not checked): accumulation is known not to mix well with BatchNorm. Why would it not
# equal one big batch for a model with `BatchNorm2d`, even with the right scaling?


# %%
# ✏️ Exercise 4: write the body of the function
def accumulation_step(model: nn.Module, micro_batches: list, optimizer: torch.optim.Optimizer) -> float:
    raise NotImplementedError("your code here")


# %%
ex.check(4, accumulation_step)

# %% [markdown]
# ## Summary
#
# * A data pipeline has three parts: a **sampler** picks the indices (`SequentialSampler`, `RandomSampler`,
#   `SubsetRandomSampler`, `WeightedRandomSampler`, or your own), a **`Dataset`** turns an index into a sample
#   (`__len__`, `__getitem__`, and it should check the index), and a **`collate_fn`** turns the list of *samples*
#   into a batch (the default stacks; pad samples of different sizes yourself). `DataLoader` runs them; a seeded
#   `generator` makes the order and the workers' random numbers repeat.
# * Worker processes each seed torch, `random` and NumPy themselves; classes and functions used inside them must be
#   importable (`spawn`/`forkserver` pickle them by name); `timeout` stops a stuck worker.
# * `transforms.v2`: `ToImage` + `ToDtype(scale=True)` + `Normalize` with the data's own mean and std.
#   Use `next(iter(loader))`, not `.next()`.
# * A sample can cost opening a file and decoding it, every epoch; `Image.open` alone decodes nothing. Decode once:
#   small data sets belong in memory as tensors (on the GPU when there is one), where batches become slices;
#   large ones go into a few big files or shards, or are decoded on the GPU.
# * A convolution's output side is $\lfloor (n + 2p - d(k-1) - 1)/s \rfloor + 1$; its parameters do not depend on
#   the image size; stacked small kernels widen the receptive field cheaply.
# * A layer is a module (holds its parameters) or a function (takes them); a module called twice shares its
#   parameters and sums their gradients. Print shapes with forward hooks, not `print` inside `forward`.
# * Softmax turns logits into probabilities; cross-entropy is the negative log-probability of the right class.
#   `CrossEntropyLoss` takes logits and applies `log_softmax` itself; a softmax before it puts a floor under the
#   loss and slows training.
# * Training is five lines per step, repeated over epochs: `model.train()` before training (BatchNorm uses batch
#   statistics, Dropout drops), `model.eval()` and `torch.no_grad()` for evaluation, loss and accuracy summed
#   over the samples. A validation split watches training; the test set is used once, at the end. With
#   BatchNorm, AdamW, a one-cycle schedule (which also cycles Adam's β1) and label smoothing, a 29k-parameter CNN
#   passes 99 % test accuracy in one epoch; a fused optimizer, and on many CPUs channels-last memory, make each
#   step cheap.
# * BatchNorm does not commute with pooling (ReLU does): moving pooling before it makes a different model.
# * Early in training the validation loss can sit below the training loss: the training loss is a mean over
#   steps during which the model improved.
# * TensorBoard: `SummaryWriter` for scalars, images, the graph (`add_graph` traces, with a `FutureWarning`)
#   and hyper-parameters; `read_events` proves what was written.

# %% [markdown]
# ## For readers of the original notes (原笔记勘误)
#
# The course was built from a teacher's study notes, written for PyTorch 1.x. This table lists what they say that
# no longer holds, or never did, and where this lesson shows what holds in PyTorch 2.14.
#
# | What the notes say | What holds in PyTorch 2.14 | Where this lesson shows it |
# |---|---|---|
# | `collate_fn` receives a list of indices | it receives the list of samples, `dataset[i]` for each index of the batch | §3 · The data pipeline, part 2 |
# | `MyDataset(10)` with `MySampler(20)` as the example of a custom batch sampler | that sampler runs past the data's end: the loader returns 20 batches, the last ones of samples that do not exist, and `len(loader)` fails; check the index in the dataset and give the sampler a `__len__` | §4 · The data pipeline, part 3 |
# | a sampler must define `__len__` | iteration needs only `__iter__`; `__len__` is needed for `len(loader)` | §4 · The data pipeline, part 3 |
# | `SubsetRandomSampler` is a lazy `RandomSampler` that shuffles the whole set | it shuffles the given indices only: a subset, e.g. a validation split | §4 · The data pipeline, part 3 |
# | `timeout`: a batch not collected in time is skipped | the DataLoader raises `RuntimeError: DataLoader timed out after … seconds` and the epoch stops | §5 · Worker processes |
# | `pin_memory` copies tensors into "CUDA pinned memory" | pinned memory is page-locked *host* memory, which the GPU copies from directly | §9 · Where tensors live |
# | `transforms.ToTensor()` and `Normalize((0.5), (0.5))` | v2: `ToImage()` + `ToDtype(torch.float32, scale=True)` (`v2.ToTensor` is deprecated); normalise with the data's mean and std, 0.1307 and 0.3081 (0.5/0.5 leaves the inputs at mean −0.74) | §6 · `transforms.v2` |
# | `images, labels = dataiter.next()` | the iterator's `.next()` was removed in PyTorch 1.13: `next(dataiter)` | §7 · Looking at a batch |
# | `super(Net, self).__init__()` | still works; Python 3's `super().__init__()` is shorter | §10.3 · Two classic MNIST models |
# | `CNNnet` prints `x.shape` after every line of `forward` | a forward hook reports the shapes from outside and is removed afterwards | §10.3 · Two classic MNIST models |
# | the comment after `dropout2` says the shape is `[100, 10]` | it is `[100, 128]` (the output of `fc1`) | §10.3 · Two classic MNIST models |
# | `nn.Dropout2d(0.5)` on the flat `[N, 128]` output of `fc1` | `Dropout2d` zeroes channels of `[N, C, H, W]` maps and warns on 2-D input: use `nn.Dropout` | §10.3 · Two classic MNIST models |
# | `Net` and `CNNnet` return `F.softmax(x)` and train with `CrossEntropyLoss` | `CrossEntropyLoss` takes logits: the extra softmax puts a floor of 1.46 under the loss and slows the start | §11 · Softmax, cross-entropy, and a softmax too many |
# | the recipe: batch 4, SGD with lr 0.001 and momentum 0.9, three epochs of per-sample PIL transforms in two workers | batch 128 sliced from tensors in memory, AdamW with a one-cycle schedule and label smoothing: at least 99 % in one epoch, in seconds | §8 · What a sample costs; §13 · The training loop |
# | accuracy from `torch.max(outputs.data, 1)` | `outputs.argmax(dim=1)` inside `torch.no_grad()`, after `model.eval()`; `.data` bypasses autograd's checks | §13 · The training loop |
# | `scheduler.get_lr()` reads the current learning rate | `get_lr()` is internal and warns; use `scheduler.get_last_lr()` | §13 · The training loop |
