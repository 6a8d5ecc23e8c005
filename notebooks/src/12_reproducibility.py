# %% [markdown]
# # 12 · Reproducibility (可复现性)
#
# **What you learn.** How to make a training run repeat bit for bit, and what breaks it:
#
# 1. one **random seed** (随机种子) for every generator, and why `PYTHONHASHSEED` set inside a program does nothing;
# 2. the **deterministic algorithm** (确定性算法) switch: `torch.use_deterministic_algorithms`, what it refuses, what cuDNN
#    needs, and why the `CUBLAS_WORKSPACE_CONFIG` variable that older guides require is no longer needed;
# 3. proof: two seeded training runs give identical parameters, one extra random draw changes them, and why
#    another machine may still differ in the last bits;
# 4. the versions to record with every result.
#
# **You should know:** a training loop with a DataLoader (notebook 04). How DataLoader worker processes are
# seeded (`generator`, `seed_worker`) is taught in [notebook 04](04_mnist_cnn.ipynb), §5; TF32 in
# [notebook 07](07_mixed_precision.ipynb), §4; choosing GPUs with `CUDA_VISIBLE_DEVICES` in the setup of
# [notebook 08](08_data_parallel_ddp.ipynb). They are only linked here.
#
# **Study time:** about 40 min (15 of them for the exercises). Its cells run in seconds.
#
# **On a GPU:** section 2 checks, in a fresh process without `CUBLAS_WORKSPACE_CONFIG`, that deterministic mode
# runs cuBLAS matrix products and repeats them bit for bit, and section 4 prints the CUDA and cuDNN versions and
# the GPU names; on the CPU each prints the same kind of line instead. The stored outputs were made on the CPU.
#
# The notes were written for PyTorch 1.x: `torch.set_deterministic` is gone, and TF32 is no longer on by default
# for matrix products. Both are shown below.

# %% [markdown]
# ## Setup

# %%
import os
import random
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from utils import get_device, seed_everything

seed_everything(0)
device = get_device()
print("torch", torch.__version__.split("+")[0], "| device:", device.type)

# %% [markdown]
# ## 1. One seed for every generator
#
# A run's **reproducibility** (可复现性; the notes also say 重现) starts with the seeds. A run draws random numbers from
# Python's `random`, NumPy, torch's CPU generator and one generator per CUDA device. The notes' `seed_torch`
# seeds all of them with one random seed (随机种子); the course's `utils.seed_everything(seed)` does the same
# (`torch.manual_seed` also seeds every CUDA device). Re-seeding replays every generator.
#
# One line of the notes has no effect: `os.environ['PYTHONHASHSEED'] = str(seed)` inside the program. Python reads
# that variable once, at interpreter start-up, to randomise `hash()` of strings (and so the iteration order of
# sets of strings). It must be set in the environment that *starts* Python (the course's test runs start this
# kernel with `PYTHONHASHSEED=0`). New Python processes show it: `subprocess` starts a fresh interpreter with the
# environment we give it.


# %%
def draw():
    return random.random(), float(np.random.rand()), torch.rand(1).item()


seed_everything(0)
first = draw()
seed_everything(0)
print("re-seeding replays python, numpy and torch:", draw() == first)


def hash_in_new_python(seed):
    env = {**os.environ, "PYTHONHASHSEED": seed}
    return subprocess.run(
        [sys.executable, "-c", "print(hash('torch'))"], env=env, capture_output=True, text=True, check=True
    ).stdout


before, original = hash("torch"), os.environ.get("PYTHONHASHSEED")
os.environ["PYTHONHASHSEED"] = "12345"  # the notes' line: too late for this interpreter
print("setting PYTHONHASHSEED at run time changes hash() here:", hash("torch") != before)
if original is None:
    del os.environ["PYTHONHASHSEED"]
else:
    os.environ["PYTHONHASHSEED"] = original
same, other = hash_in_new_python("1") == hash_in_new_python("1"), hash_in_new_python("1") != hash_in_new_python("2")
print("new interpreters: same seed -> same hash:", same, "| other seed -> other hash:", other)
assert hash("torch") == before and same and other

# %% [markdown]
# ## 2. Deterministic algorithms (确定性算法)
#
# Seeds do not make every kernel repeatable: some CUDA kernels accumulate with atomic additions in whatever order
# threads finish, and cuDNN may pick a different convolution algorithm each run. The notes' switch
# `torch.set_deterministic(True)` (PyTorch 1.7) was renamed **`torch.use_deterministic_algorithms(True)`** in 1.8
# and removed later. With it, PyTorch uses deterministic implementations where they exist and **raises** for
# operations that have none (`warn_only=True` turns that into a warning).
#
# **cuBLAS and `CUBLAS_WORKSPACE_CONFIG`.** Many guides (and PyTorch's own documentation until 2025) say that
# deterministic mode on CUDA also needs the environment variable `CUBLAS_WORKSPACE_CONFIG=:4096:8` (or `:16:8`),
# set before the process's first cuBLAS call, and older PyTorch releases made every cuBLAS matrix product raise a
# `RuntimeError` in deterministic mode without it. The reason was NVIDIA's: with several CUDA streams, cuBLAS may
# pick different internal implementations unless each stream has its own workspace. PyTorch has long given each
# cuBLAS handle and stream its own workspace (`cublasSetWorkspace`, since 2022), which is what NVIDIA asks for,
# so in late 2025 it dropped the requirement and the check (pull request #161749). PyTorch 2.14 has no such check,
# and `use_deterministic_algorithms`' documentation no longer names the variable. The variable only sets the size
# of those workspaces now, read once at the first cuBLAS call; `torch.backends.cuda.cublas_workspace_size(n)`
# changes it at run time. This course does not set it.
#
# cuDNN convolutions: deterministic mode already restricts cuDNN to deterministic algorithms (it implies the older,
# narrower switch `cudnn.deterministic = True`: `aten/src/ATen/native/Convolution.cpp` passes
# `deterministicCuDNN() || deterministicAlgorithms()`), but `cudnn.benchmark = True` times the candidates on each new
# input shape and keeps the fastest, and the winner can differ from run to run, and so can its rounding. The
# cookbook in the notes sets `benchmark = True` *and* `deterministic = True`: choose `benchmark = False` when
# results must repeat. `seed_everything(seed, deterministic=True)` sets all of these.
#
# A CPU example of an operation refused in deterministic mode is `put_` with its default `accumulate=False`
# (with repeated indices, which write wins is undefined, so it is refused whatever the indices; with
# `accumulate=True` it is allowed). Deterministic mode also fills memory from `torch.empty` with NaN, so that
# reading uninitialised memory is visible instead of random.

# %%
print("torch.set_deterministic exists:", hasattr(torch, "set_deterministic"))
seed_everything(0, deterministic=True)
print(
    "deterministic algorithms:",
    torch.are_deterministic_algorithms_enabled(),
    "| cudnn.deterministic =",
    torch.backends.cudnn.deterministic,
    "| cudnn.benchmark =",
    torch.backends.cudnn.benchmark,
)
assert not hasattr(torch, "set_deterministic") and torch.are_deterministic_algorithms_enabled()
assert not torch.backends.cudnn.benchmark
refused = []
for indices in ([0, 0], [0, 1]):  # repeated indices, then distinct ones
    try:
        torch.zeros(3).put_(torch.tensor(indices), torch.tensor([1.0, 2.0]))
    except RuntimeError as err:
        refused.append(indices)
        print(f"put_ at {indices}: {type(err).__name__}: {str(err).split(',')[0]}")
torch.zeros(3).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]), accumulate=True)  # allowed
assert refused == [[0, 0], [0, 1]]
print("torch.empty(3) in deterministic mode:", torch.empty(3))
assert torch.isnan(torch.empty(3)).all()
seed_everything(0, deterministic=False)
assert not torch.are_deterministic_algorithms_enabled()

# %% [markdown]
# The cuBLAS claim, checked: the installed documentation no longer names the variable, the run-time setter
# exists, and on a GPU a fresh Python process (so that nothing has touched cuBLAS yet) with the variable removed
# from its environment runs matrix products in deterministic mode and gets identical bits every time.

# %%
doc = torch.use_deterministic_algorithms.__doc__ or ""
print(
    "use_deterministic_algorithms' documentation names CUBLAS_WORKSPACE_CONFIG:",
    "CUBLAS_WORKSPACE_CONFIG" in doc,
    "| torch.backends.cuda.cublas_workspace_size exists:",
    hasattr(torch.backends.cuda, "cublas_workspace_size"),
)
assert "CUBLAS_WORKSPACE_CONFIG" not in doc and hasattr(torch.backends.cuda, "cublas_workspace_size")
if device.type == "cuda":
    probe = (
        "import torch\n"
        "torch.use_deterministic_algorithms(True)\n"
        "a = torch.randn(1024, 1024, device='cuda')\n"
        "print(all(torch.equal(a @ a, a @ a) for _ in range(10)))\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "CUBLAS_WORKSPACE_CONFIG"}
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    print(
        "fresh process without the variable, deterministic mode: matmul ran:",
        result.returncode == 0,
        "| identical bits:",
        result.stdout.strip(),
    )
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr[-1000:]
else:
    print("CPU run: on a GPU a fresh process runs deterministic cuBLAS matrix products without the variable")

# %% [markdown]
# ### Seeding DataLoader workers: see notebook 04
#
# Each DataLoader worker is a separate process with its own generators. Each time the workers start (every
# epoch, unless `persistent_workers=True` keeps them), the loader draws a `base_seed` from its `generator` and
# seeds each worker's torch and Python `random` with `base_seed + worker_id`, and, since PyTorch 1.9, NumPy too
# (before 1.9 every worker inherited the same NumPy state and produced the same "random" augmentations).
# Pass `generator=torch.Generator().manual_seed(seed)` and, for other libraries, a `worker_init_fn` such as the
# documentation's `seed_worker`: [notebook 04](04_mnist_cnn.ipynb), §5 runs it.

# %% [markdown]
# ## 3. Proof: two runs, identical parameters, and what breaks it
#
# With everything seeded, two training runs (random initialisation, shuffled loader, Dropout) give **bit-for-bit**
# identical parameters. Consuming a single extra random number anywhere (a debugging `torch.randn`, one more
# augmentation, a layer added and removed) shifts every later draw, and the run diverges; a loader with its own
# `generator` is at least immune to what happens to the global generator.


# %%
def train_once(seed, extra_draw=False):
    seed_everything(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
    if extra_draw:
        torch.randn(1)  # e.g. a debugging print of random data
    inputs = torch.linspace(-1, 1, 256).unsqueeze(1).repeat(1, 8)
    data = TensorDataset(inputs, inputs[:, :1].sin())
    loader = DataLoader(data, batch_size=32, shuffle=True)  # shuffles with the global generator
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        for xb, yb in loader:
            optimizer.zero_grad()
            F.mse_loss(model(xb), yb).backward()
            optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


run_a, run_b = train_once(0), train_once(0)
print("same seed, two runs, identical parameters:", torch.equal(run_a, run_b))
print("one extra random draw, identical parameters:", torch.equal(run_a, train_once(0, extra_draw=True)))
assert torch.equal(run_a, run_b) and not torch.equal(run_a, train_once(0, extra_draw=True))


def shuffled_order(generator=None):
    loader = DataLoader(range(8), batch_size=8, shuffle=True, generator=generator)
    return next(iter(loader)).tolist()


seed_everything(0)
own = shuffled_order(torch.Generator().manual_seed(0))
torch.randn(1)  # the same extra draw
print(
    "loader with its own generator, after an extra global draw, same order:",
    shuffled_order(torch.Generator().manual_seed(0)) == own,
)
assert shuffled_order(torch.Generator().manual_seed(0)) == own

# %% [markdown]
# Even with identical random numbers, bit-for-bit results need the same **order of floating-point operations**.
# Float addition is not associative, so a different number of threads, another CPU's vector width, a GPU, or
# another batch split can change the last bits, and training amplifies them. As the cookbook in the notes says,
# full reproducibility across different hardware is not guaranteed; on the same machine and software it is.

# %%
big, one = torch.tensor(1e8), torch.tensor(1.0)
left, right = (big + one) - big, (big - big) + one
print(f"float32: (1e8 + 1) - 1e8 = {left.item():.0f} | (1e8 - 1e8) + 1 = {right.item():.0f}")
assert left != right

# %% [markdown]
# ## 4. Environment checks
#
# The cookbook opens by printing versions; report them with every result you want to reproduce. On a GPU
# machine: `torch.version.cuda` is the CUDA version PyTorch was **built** with (Linux pip wheels pull in the
# CUDA runtime, cuBLAS and cuDNN as `nvidia-*` packages, so only the driver must be installed, as the notes
# found), `torch.backends.cudnn.version()` the cuDNN version, `torch.cuda.get_device_name(i)` each GPU.
#
# The notes also say TF32 (a faster, less precise float32 on Ampere and later GPUs) is on by default for matrix
# products; that was PyTorch 1.7–1.11 ([notebook 07](07_mixed_precision.ipynb), §4 explains TF32). The print
# records the current switches, which belong with every result too (TF32 for cuDNN convolutions is still on).

# %%
print(
    "python",
    ".".join(map(str, sys.version_info[:2])),
    "| torch",
    torch.__version__.split("+")[0],
    "| numpy",
    np.__version__.split(".")[0] + ".x",
)
print(
    "TF32 for matmul:",
    torch.backends.cuda.matmul.allow_tf32,
    "| TF32 for cuDNN convolutions:",
    torch.backends.cudnn.allow_tf32,
    "| float32 matmul precision:",
    torch.get_float32_matmul_precision(),
)
assert not torch.backends.cuda.matmul.allow_tf32
if torch.cuda.is_available():
    print(
        "CUDA",
        torch.version.cuda,
        "| cuDNN",
        torch.backends.cudnn.version(),
        "|",
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    )
else:
    print("CPU run: CUDA version, cuDNN version and GPU names are printed when a GPU is visible")

# %% [markdown]
# ## Exercises (练习)
#
# Three exercises, easiest first: predict, write a function, then a stretch that combines this notebook with the
# checkpoints of notebook 06. Each has a **stub cell** that starts with `# ✏️ Exercise N`: edit it and run it.
# The **check cell** below it then says *correct*, or *not yet* with a hint and the section to re-read, or *not
# attempted yet* while the stub is untouched. This section does not depend on the lesson's cells: after a kernel
# restart, run its first cell and go on. `make progress` lists which exercises of every notebook pass.

# %%
import random

import numpy as np
import torch
from torch.utils.data import DataLoader

from utils.exercises import Checker

ex = Checker("12")

# %% [markdown]
# ### Exercise 1 · Identical or not?
#
# The notes' `seed_torch` seeds every generator; sections 1 and 3 show what one extra draw does. For each pair
# below, on the CPU, are `a` and `b` identical? Predict before running anything; one of the four goes a step
# beyond section 3, and the hint explains it.
#
# ```python
# # (a)
# torch.manual_seed(0); a = torch.randn(3)
# g = torch.Generator().manual_seed(0); b = torch.randn(3, generator=g)
# # (b)
# torch.manual_seed(0); a = torch.randn(3)
# torch.manual_seed(0); np.random.rand(); random.random(); b = torch.randn(3)
# # (c)
# torch.manual_seed(0); a = torch.randn(3)
# torch.manual_seed(0)
# for batch in DataLoader(range(4), batch_size=2):  # no shuffling
#     pass
# b = torch.randn(3)
# # (d)
# loader = DataLoader(range(8), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))
# a = next(iter(loader)); b = next(iter(loader))  # the first batch of two epochs
# ```

# %%
# ✏️ Exercise 1: replace ... with four booleans for (a)-(d), True where a and b are identical
answer_1 = ...

# %%
ex.check(1, answer_1)

# %% [markdown]
# ### Exercise 2 · A loader whose shuffling repeats
#
# Write `seeded_loader(dataset, batch_size, seed)`. It returns a `DataLoader` that shuffles anew every epoch and
# whose sequence of epoch orders is fixed by `seed`: the same every time it is built with that seed (another
# seed, other orders), whatever else the program draws. It must never reseed or draw from the global generator,
# not even once per epoch; that is also what makes worker processes repeat (section 3 and
# [notebook 04](04_mnist_cnn.ipynb), §5).


# %%
# ✏️ Exercise 2: write the body of the function
def seeded_loader(dataset, batch_size: int, seed: int) -> DataLoader:
    raise NotImplementedError("your code here")


# %%
ex.check(2, seeded_loader)

# %% [markdown]
# ### Exercise 3 · Save and restore every generator (stretch)
#
# A resumed run repeats the uninterrupted one only if its checkpoint holds the random states too
# ([notebook 06](06_save_load_checkpoints.ipynb), §5, the table of what the notes' recipe misses). Write
# `rng_snapshot()`, which returns the current states of Python's `random`, NumPy's global generator, torch's CPU
# generator and, when CUDA is available, every GPU's; and `rng_restore(snapshot)`, which puts them back, so that
# the draws after a restore are the draws that followed the snapshot. The snapshot goes into a checkpoint, so it
# must survive `torch.save` and `torch.load(..., weights_only=True)` ([notebook 06](06_save_load_checkpoints.ipynb),
# §4): the check saves and loads it before restoring. (`utils.checkpoint_files` has such functions; write your own.)


# %%
# ✏️ Exercise 3: write the bodies of the two functions
def rng_snapshot() -> dict:
    raise NotImplementedError("your code here")


def rng_restore(snapshot: dict) -> None:
    raise NotImplementedError("your code here")


# %%
ex.check(3, rng_snapshot, rng_restore)

# %% [markdown]
# ## Summary
#
# * Seed every generator (Python, NumPy, torch on every device) with one seed; `PYTHONHASHSEED` only works in the
#   environment that starts Python. DataLoader workers follow the loader's `generator` (notebook 04, §5).
# * `torch.use_deterministic_algorithms(True)` (the notes' `torch.set_deterministic` is gone) picks deterministic
#   kernels (cuDNN's included) and raises where there are none; on CUDA also set `cudnn.benchmark = False`.
#   `CUBLAS_WORKSPACE_CONFIG=:4096:8`, which older releases demanded, is no longer needed in PyTorch 2.14.
# * With all of that, two runs on the same machine and software give bit-for-bit identical parameters. One extra
#   random draw shifts every later draw; another thread count or other hardware changes the last bits of the
#   arithmetic, and training amplifies them.
# * Record versions (Python, torch, CUDA, cuDNN, GPU) with every result; TF32 for matrix products has been off by
#   default since PyTorch 1.12 (notebook 07). `CUDA_VISIBLE_DEVICES` chooses and renumbers GPUs (notebook 08).
