# %% [markdown]
# # 12 · Reproducibility (可复现性)
#
# **What you learn.** How to make a training run repeat bit for bit, and what breaks it:
#
# 1. one random seed (随机种子) for every generator, and why `PYTHONHASHSEED` set inside a program does nothing;
# 2. deterministic algorithms (确定性算法): `torch.use_deterministic_algorithms`, what it refuses, what cuDNN and
#    cuBLAS need, and when `CUBLAS_WORKSPACE_CONFIG` must be set;
# 3. proof: two seeded training runs give identical parameters, one extra random draw changes them, and why
#    another machine may still differ in the last bits;
# 4. the versions to record with every result.
#
# **You should know:** a training loop with a DataLoader (notebook 04). How DataLoader worker processes are
# seeded (`generator`, `seed_worker`) is taught in [notebook 04](04_mnist_cnn.ipynb), §5; TF32 in
# [notebook 07](07_mixed_precision.ipynb), §4; choosing GPUs with `CUDA_VISIBLE_DEVICES` in the setup of
# [notebook 08](08_data_parallel_ddp.ipynb). They are only linked here.
#
# **Study time:** about 25 min. **Run time:** 25 s on the 2-core course machine (one thread, measured by
# `make execute`).
#
# **On a GPU:** `CUBLAS_WORKSPACE_CONFIG` is set by the setup cell before any CUDA work, deterministic mode then
# also covers cuBLAS, and section 4 prints the CUDA and cuDNN versions and the GPU names; on the CPU it prints
# the same kind of line instead. The stored outputs were made on the CPU.
#
# The notes were written for PyTorch 1.x: `torch.set_deterministic` is gone, and TF32 is no longer on by default
# for matrix products. Both are shown below.

# %% [markdown]
# ## Setup
#
# `CUBLAS_WORKSPACE_CONFIG=:4096:8` makes cuBLAS use fixed workspaces, which deterministic mode needs on CUDA 10.2
# and later. cuBLAS reads it when the process first uses cuBLAS (its first matrix product on the GPU), so it is
# set here, before `torch` is imported and before any CUDA work; setting it later in a GPU session would have no
# effect. On the CPU it is harmless.

# %%
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before the first cuBLAS call of this process

import random  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from utils import get_device, seed_everything  # noqa: E402

seed_everything(0)
device = get_device()
print("torch", torch.__version__.split("+")[0], "| device:", device.type,
      "| CUBLAS_WORKSPACE_CONFIG =", os.environ["CUBLAS_WORKSPACE_CONFIG"])
assert os.environ["CUBLAS_WORKSPACE_CONFIG"] in (":4096:8", ":16:8")

# ## 1. One seed for every generator
#
# **Reproducibility (可复现性**, the notes also say 重现) starts with the seeds. A run draws random numbers from
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
    return subprocess.run([sys.executable, "-c", "print(hash('torch'))"], env=env, capture_output=True,
                          text=True, check=True).stdout


before, original = hash("torch"), os.environ.get("PYTHONHASHSEED")
os.environ["PYTHONHASHSEED"] = "12345"  # the notes' line: too late for this interpreter
print("setting PYTHONHASHSEED at run time changes hash() here:", hash("torch") != before)
if original is None:
    del os.environ["PYTHONHASHSEED"]
else:
    os.environ["PYTHONHASHSEED"] = original
print("new interpreters: same seed -> same hash:", hash_in_new_python("1") == hash_in_new_python("1"),
      "| other seed -> other hash:", hash_in_new_python("1") != hash_in_new_python("2"))
assert hash("torch") == before and hash_in_new_python("1") != hash_in_new_python("2")

# %% [markdown]
# ## 2. Deterministic algorithms (确定性算法)
#
# Seeds do not make every kernel repeatable: some CUDA kernels accumulate with atomic additions in whatever order
# threads finish, and cuDNN may pick a different convolution algorithm each run. The notes' switch
# `torch.set_deterministic(True)` (PyTorch 1.7) was renamed **`torch.use_deterministic_algorithms(True)`** in 1.8
# and removed later. With it, PyTorch uses deterministic implementations where they exist and **raises** for
# operations that have none (`warn_only=True` turns that into a warning). On CUDA it also needs the environment
# variable `CUBLAS_WORKSPACE_CONFIG=:4096:8` (without it, deterministic mode makes cuBLAS matrix products raise).
# cuBLAS reads it at the process's first cuBLAS call, so the setup cell set it before any CUDA work;
# `seed_everything(seed, deterministic=True)` also sets it when it is unset, which only helps if that call comes
# before the first matrix product on the GPU. cuDNN needs `cudnn.deterministic = True` with
# `cudnn.benchmark = False`. The cookbook in the notes sets `benchmark = True`
# *and* `deterministic = True`: the benchmark still times algorithms each run, so choose `benchmark = False` when
# results must repeat. `seed_everything(seed, deterministic=True)` sets all of these.
#
# A CPU example of an operation refused in deterministic mode is `put_` with its default `accumulate=False`
# (with repeated indices, which write wins is undefined, so it is refused whatever the indices). Deterministic mode also fills memory from `torch.empty` with NaN, so that reading uninitialised
# memory is visible instead of random.

# %%
print("torch.set_deterministic exists:", hasattr(torch, "set_deterministic"))
seed_everything(0, deterministic=True)
print("deterministic algorithms:", torch.are_deterministic_algorithms_enabled(),
      "| CUBLAS_WORKSPACE_CONFIG =", os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
      "| cudnn.deterministic =", torch.backends.cudnn.deterministic, "| cudnn.benchmark =",
      torch.backends.cudnn.benchmark)
try:
    torch.zeros(3).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))
except RuntimeError as err:
    print(f"{type(err).__name__}: {str(err).split(',')[0]}")
print("torch.empty(3) in deterministic mode:", torch.empty(3))
assert torch.isnan(torch.empty(3)).all()
seed_everything(0, deterministic=False)
assert not torch.are_deterministic_algorithms_enabled()

# %% [markdown]
# ### Seeding DataLoader workers: see notebook 04
#
# Each DataLoader worker is a separate process with its own generators, seeded by the loader from its
# `generator` every epoch (torch with `base_seed + worker_id`, and since PyTorch 1.9 also Python's `random` and
# NumPy; before 1.9 every worker inherited the same NumPy state and produced the same "random" augmentations).
# Pass `generator=torch.Generator().manual_seed(seed)` and, for other libraries, a `worker_init_fn` such as the
# documentation's `seed_worker`: [notebook 04](04_mnist_cnn.ipynb), §5 runs it.
#
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
# machine: `torch.version.cuda` is the CUDA version PyTorch was **built** with (pip wheels bundle CUDA and cuDNN,
# so only the driver must be installed, as the notes found), `torch.backends.cudnn.version()` the cuDNN version,
# `torch.cuda.get_device_name(i)` each GPU.
#
# The notes also say TF32 (a faster, less precise float32 on Ampere and later GPUs) is on by default for matrix
# products; that was PyTorch 1.7–1.11 ([notebook 07](07_mixed_precision.ipynb), §4 explains TF32). The print records
# the current switches, which belong with every result too.

# %%
print("python", ".".join(map(str, sys.version_info[:2])), "| torch", torch.__version__.split("+")[0],
      "| numpy", np.__version__.split(".")[0] + ".x")
print("TF32 for matmul:", torch.backends.cuda.matmul.allow_tf32, "| TF32 for cuDNN convolutions:",
      torch.backends.cudnn.allow_tf32, "| float32 matmul precision:", torch.get_float32_matmul_precision())
assert not torch.backends.cuda.matmul.allow_tf32
if torch.cuda.is_available():
    print("CUDA", torch.version.cuda, "| cuDNN", torch.backends.cudnn.version(), "|",
          [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
else:
    print("CPU run: CUDA version, cuDNN version and GPU names are printed when a GPU is visible")

# %% [markdown]
# ## Summary
#
# * Seed every generator (Python, NumPy, torch on every device) with one seed; `PYTHONHASHSEED` only works in the
#   environment that starts Python. DataLoader workers follow the loader's `generator` (notebook 04, §5).
# * `torch.use_deterministic_algorithms(True)` (the notes' `torch.set_deterministic` is gone) picks deterministic
#   kernels and raises where there are none; on CUDA also `cudnn.benchmark = False`, `cudnn.deterministic = True`
#   and `CUBLAS_WORKSPACE_CONFIG=:4096:8` set before the process's first cuBLAS call.
# * With all of that, two runs on the same machine and software give bit-for-bit identical parameters; one extra
#   random draw, another thread count or other hardware changes the last bits, and training amplifies them.
# * Record versions (Python, torch, CUDA, cuDNN, GPU) with every result; TF32 for matrix products has been off by
#   default since PyTorch 1.12 (notebook 07). `CUDA_VISIBLE_DEVICES` chooses and renumbers GPUs (notebook 08).
