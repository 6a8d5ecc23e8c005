# %% [markdown]
# # 12 · Reproducibility (可复现性)
#
# You train a model, get 97.3 % accuracy, change nothing, run it again, and get 97.1 %. Which run is right, and
# did your last code change help or not? A result you cannot repeat cannot be debugged or compared. This lesson
# shows where the differences come from, how to remove the ones you control, and which ones remain.
#
# **You will learn to**
#
# - seed every **random number generator** (随机数生成器) a training run uses (Python's `random`, NumPy, torch on
#   the CPU and on every GPU) with one seed, written out as a five-line function;
# - set `PYTHONHASHSEED` where it works (in the environment that starts Python), and see why setting it inside the
#   program does nothing;
# - use **generator objects** (`np.random.default_rng`, `torch.Generator`), which global seeding does not touch,
#   and seed DataLoader shuffling and worker processes;
# - switch on **deterministic algorithms** (确定性算法) with `torch.use_deterministic_algorithms`, read what it
#   refuses, and know why the `CUBLAS_WORKSPACE_CONFIG` variable of older guides is no longer needed;
# - prove that two seeded runs give bit-for-bit identical parameters, and see what still changes the last bits:
#   one extra random draw, the number of threads, the batch size, the CPU's vector instructions, the device;
# - record the versions and settings that belong with every result.
#
# **Before this notebook:** a training loop with a `DataLoader` (notebook 04); how DataLoader worker processes
# start, and why the code they run must live in a module (notebook 04, §5); saving a checkpoint and
# `torch.load(..., weights_only=True)` (notebook 06) for Exercise 3. TF32 is explained in notebook 07, §4.
#
# **Study time:** about 80 min (20 of them for the exercises). Its cells run in seconds, apart from one that
# starts a fresh Python with PyTorch (a few seconds).
#
# **On a GPU.** §1 replays the GPU's generator too; §2.1 checks, in a fresh process, that deterministic mode runs
# cuBLAS matrix products without `CUBLAS_WORKSPACE_CONFIG` and that two CUDA streams get the same bits; §3.2 compares
# the GPU's matrix product with the CPU's; §4 prints the CUDA and cuDNN versions and the GPU names. On the CPU
# each of these prints what it could not check instead. The stored outputs were made on the CPU.
#
# This lesson grew out of a teacher's study notes (in Chinese, written for PyTorch 1.x). You do not need them: what
# they say that no longer holds is listed in the last section, for readers who have them.

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
# `get_device()` (notebook 01) picks CUDA, then Apple's MPS, then the CPU. `seed_everything` is the course's
# seeding helper, used by every notebook since 01: §1 and §2 write out what it does.

# %%
import inspect
import os
import random
import subprocess
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from utils import get_device, seed_everything
from utils.data import WorkerTagged, seed_worker

device = get_device()
print("torch", torch.__version__.split("+")[0], "| device:", device.type)

# %% [markdown]
# ## 1. One seed for every generator
#
# A random number generator is an algorithm plus a **state** (状态): each draw computes a number from the state
# and moves the state on. A **random seed** (随机种子) sets the state, so the same seed gives the same sequence of
# draws. A training run draws from several independent generators:
#
# | Generator | Used by | Seeded with |
# |---|---|---|
# | Python's `random` | your own code, some data augmentations | `random.seed(seed)` |
# | NumPy's global generator | `np.random.rand`, `np.random.shuffle`, many older libraries | `np.random.seed(seed)` |
# | torch's CPU generator | `torch.rand`, weight initialisation, `Dropout`, DataLoader shuffling | `torch.manual_seed(seed)` |
# | one torch generator per GPU | `torch.rand(..., device="cuda")`, `Dropout` on the GPU | `torch.manual_seed(seed)` too |
#
# `torch.manual_seed` seeds the CPU generator *and* the generator of every CUDA (and MPS) device: its source,
# `torch/random.py`, calls `torch.cuda.manual_seed_all(seed)`. Older code often adds `torch.cuda.manual_seed(seed)`
# and `torch.cuda.manual_seed_all(seed)`; they are harmless and redundant. Each generator's state can also be read
# and set (`random.getstate()`, `np.random.get_state()`, `torch.get_rng_state()`) to store it in a checkpoint;
# NumPy's state holds a NumPy array, which `torch.load(..., weights_only=True)` refuses, so it is stored converted
# to tensors or lists, as [notebook 06](06_save_load_checkpoints.ipynb), §5 shows (Exercise 3 needs this). The whole
# recipe:


# %%
def seed_all(seed):
    random.seed(seed)  # Python's random
    np.random.seed(seed)  # NumPy's global generator
    torch.manual_seed(seed)  # torch's CPU generator and every GPU's
    return seed


def draw():
    """One number from each generator (and from the GPU's, when there is one)."""
    numbers = [random.random(), float(np.random.rand()), torch.rand(1).item()]
    if device.type != "cpu":
        numbers.append(torch.rand(1, device=device).item())
    return numbers


seed_all(0)
first = draw()
seed_all(0)
again = draw()
seed_everything(0)
helper = draw()
print("draws after seed_all(0):", [round(x, 4) for x in first[:3]])
print("re-seeding replays every generator:", again == first, "| seed_everything(0) gives the same:", helper == first)
assert again == first and helper == first

# %% [markdown]
# ### 1.1 `PYTHONHASHSEED`: set before Python starts
#
# Python randomises `hash()` of strings in every new interpreter (a protection against crafted inputs that make
# dictionaries slow), and with it the iteration order of a `set` of strings. Code that iterates over such a set,
# to build a vocabulary for instance, can then number its items differently in every run. The variable
# `PYTHONHASHSEED` fixes that randomisation, but Python reads it **once, at start-up**. Older seeding functions
# often contain `os.environ["PYTHONHASHSEED"] = str(seed)`: inside a running program that line changes nothing.
# It must be set in the environment that *starts* Python (`PYTHONHASHSEED=0 python train.py`, or in the
# kernel's environment for a notebook).
#
# `subprocess.run` starts a fresh interpreter with the environment we give it, which shows both halves:


# %%
def hash_in_new_python(seed):
    env = {**os.environ, "PYTHONHASHSEED": seed}
    return subprocess.run(
        [sys.executable, "-c", "print(hash('torch'))"], env=env, capture_output=True, text=True, check=True
    ).stdout


before, original = hash("torch"), os.environ.get("PYTHONHASHSEED")
os.environ["PYTHONHASHSEED"] = "12345"  # what older seeding functions do: too late for this interpreter
print("setting PYTHONHASHSEED at run time changes hash() here:", hash("torch") != before)
if original is None:
    del os.environ["PYTHONHASHSEED"]
else:
    os.environ["PYTHONHASHSEED"] = original
same, other = hash_in_new_python("1") == hash_in_new_python("1"), hash_in_new_python("1") != hash_in_new_python("2")
print("new interpreters: same seed -> same hash:", same, "| other seed -> other hash:", other)
assert hash("torch") == before and same and other

# %% [markdown]
# ### 1.2 Generator objects: `np.random.default_rng` and `torch.Generator`
#
# The global generators are shared by every library in the process, so any of them can move them on. That is why
# newer code creates **generator objects** (生成器对象) of its own: NumPy's `np.random.default_rng(seed)` (the
# API NumPy recommends since 1.17; notebooks 01 and 02 use it) and torch's `torch.Generator().manual_seed(seed)`,
# passed as `generator=` to `torch.rand`, `torch.randperm` or a `DataLoader`. They have their own state:
#
# * `np.random.seed` and `torch.manual_seed` do **not** touch them, so the recipe above does not seed them;
#   each must be created from the run's seed;
# * the global torch generator is itself a `torch.Generator` (`torch.default_generator`), so a
#   `torch.Generator().manual_seed(s)` produces exactly the stream that `torch.manual_seed(s)` starts: same seed,
#   same numbers, whichever generator draws them;
# * `np.random.default_rng()` without a seed takes fresh entropy from the operating system: a different stream in
#   every run, whatever you seeded;
# * for several independent streams from one seed (one per dataset, per worker, per experiment), NumPy's
#   `SeedSequence(seed).spawn(n)` derives `n` well-separated seeds.

# %%
rng = np.random.default_rng(0)
from_rng = rng.random(3)
np.random.seed(0)  # seeds NumPy's *global* generator only
after_global_seed = rng.random(3)
print("a fresh default_rng(0) replays:", np.array_equal(np.random.default_rng(0).random(3), from_rng))
print("np.random.seed(0) restarted rng:", np.array_equal(after_global_seed, from_rng))
print(
    "two unseeded default_rng() agree:",
    np.array_equal(np.random.default_rng().random(3), np.random.default_rng().random(3)),
)
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
own = torch.rand(3, generator=g)
torch.manual_seed(1)
same_stream = torch.equal(torch.rand(3), own)  # the global generator seeded with 1 gives g's numbers
print("torch.manual_seed(1) and torch.Generator().manual_seed(1) give the same stream:", same_stream)
torch.manual_seed(0)  # the global seed does not restart g
print("torch.manual_seed(0) restarted a torch.Generator:", torch.equal(torch.rand(3, generator=g), own))
streams = [np.random.default_rng(child) for child in np.random.SeedSequence(0).spawn(2)]
print("SeedSequence(0).spawn(2): two different streams:", streams[0].random() != streams[1].random())
assert np.array_equal(np.random.default_rng(0).random(3), from_rng)
assert not np.array_equal(after_global_seed, from_rng) and not torch.equal(torch.rand(3, generator=g), own)
assert same_stream

# %% [markdown]
# ### 1.3 DataLoader workers: `generator` and `worker_init_fn`
#
# A `DataLoader` draws from its `generator=`, or from torch's global generator when it has none. It does so at
# every `iter(loader)`, that is at every epoch, even with `shuffle=False` and `num_workers=0`: it draws one number,
# the `base_seed` for its workers. When it shuffles without a `generator=`, its `RandomSampler` also draws a seed
# from the global generator at every epoch, and shuffles with a private `torch.Generator` seeded with it. So one
# pass over any loader moves the global generator, and every random number drawn after it changes. The cell shows
# it with `torch.get_rng_state()` (notebook 06), the global generator's state as a byte tensor.

# %%
torch.manual_seed(0)
state_before = torch.get_rng_state()
batches = [batch.tolist() for batch in DataLoader(range(4), batch_size=2)]  # no shuffling, no workers
moved = not torch.equal(state_before, torch.get_rng_state())
print("batches:", batches, "| the pass moved the global generator:", moved)
assert moved

# %% [markdown]
# Each **worker process** (工作进程) (`num_workers > 0`, notebook 04, §5) has generators of its own. Worker `k`
# seeds torch and `random` with `base_seed + k` and NumPy's global generator with a value derived from both
# (`torch/utils/data/_utils/worker.py`; before PyTorch 1.9 NumPy was not seeded, so every worker produced the same
# "random" augmentations); with `persistent_workers=True` the workers, and their seeds, are kept from one epoch to
# the next. The loader does not seed generator objects: one that your dataset creates in `__init__` (a
# `default_rng`, say) is copied into every worker with the same state, and all workers draw the same numbers.
# Create it in the worker instead, from `torch.initial_seed()`: it returns the seed the global torch generator was
# last seeded with, which inside worker `k` is `base_seed + k`.
#
# So the recipe is: give the loader `generator=torch.Generator().manual_seed(seed)`, and pass a
# `worker_init_fn` for everything else the workers use. PyTorch's documentation suggests `seed_worker`, which the
# course keeps in `utils/data.py` (a worker started with *spawn* must import it by name, notebook 04, §5).
# The cell loads `WorkerTagged(4)`, a small dataset from the same module whose item `i` is a row of four integers:
# the index `i`, the id of the worker that loaded it, and one random integer below 1000 drawn in that worker from
# torch's global generator and one from NumPy's:

# %%
source = inspect.getsource(seed_worker)
signature, _, rest = source.partition('    """')
print(signature + rest.split('"""', 1)[1].lstrip("\n"))  # the function without its docstring


def worker_rows(seed):
    """(index, worker, torch draw, numpy draw) for each item, loaded by two seeded worker processes."""
    loader = DataLoader(
        WorkerTagged(4),
        batch_size=2,
        num_workers=2,
        generator=torch.Generator().manual_seed(seed),
        worker_init_fn=seed_worker,
    )
    return [tuple(int(v) for v in row) for batch in loader for row in zip(*batch)]


rows = worker_rows(0)
print("index, worker, torch draw, numpy draw:", rows)
print("same seed, same draws in the workers:", worker_rows(0) == rows)
assert worker_rows(0) == rows and [r[1] for r in rows] == [0, 0, 1, 1]

# %% [markdown]
# ## 2. Deterministic algorithms (确定性算法)
#
# Seeds fix the random numbers, not the arithmetic. Some kernels give different results from run to run with the
# same inputs: CUDA kernels that accumulate with atomic additions (scatter-add, `index_add_`, the backward of
# many pooling and interpolation layers) add in whatever order the GPU threads finish, and cuDNN may choose among
# several convolution algorithms. `torch.use_deterministic_algorithms(True)` (PyTorch 1.8 and later; older code
# calls `torch.set_deterministic(True)`, removed since) makes PyTorch use a deterministic implementation where one
# exists and **raise** `RuntimeError` for operations that have none (`warn_only=True` turns that into a warning).
#
# For convolutions it also restricts cuDNN to deterministic algorithms (it implies the older, narrower switch
# `torch.backends.cudnn.deterministic = True`: `aten/src/ATen/native/Convolution.cpp` passes
# `deterministicCuDNN() || deterministicAlgorithms()`). A separate switch still matters:
# `torch.backends.cudnn.benchmark = True` times the candidate algorithms on each new input shape and keeps the
# fastest (faster training, notebook 11), and the winner, and so its rounding, can change from run to run.
# Set it to `False` when results must repeat. Written out:

# %%
print("torch.set_deterministic exists:", hasattr(torch, "set_deterministic"))
torch.use_deterministic_algorithms(True)
torch.backends.cudnn.deterministic = True  # implied by the line above; older code sets it explicitly
torch.backends.cudnn.benchmark = False
switches = (
    torch.are_deterministic_algorithms_enabled(),
    torch.backends.cudnn.deterministic,
    torch.backends.cudnn.benchmark,
)
print("deterministic algorithms, cudnn.deterministic, cudnn.benchmark:", switches)
torch.use_deterministic_algorithms(False)
torch.backends.cudnn.deterministic = False
seed_everything(0, deterministic=True)  # the course's helper sets the same three switches
print(
    "seed_everything(0, deterministic=True) sets the same:",
    switches
    == (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    ),
)
assert not hasattr(torch, "set_deterministic") and switches == (True, True, False)
assert torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.benchmark

# %% [markdown]
# What it refuses, on the CPU: `put_` with its default `accumulate=False`. With repeated indices, which write
# wins is undefined, so it is refused whatever the indices; with `accumulate=True` it is allowed. With
# `warn_only=True` the same call runs and warns. Deterministic mode also fills memory from `torch.empty` with NaN
# (integers with their largest value), so that reading uninitialised memory shows up instead of giving random
# numbers; once a program is known to be correct, `torch.utils.deterministic.fill_uninitialized_memory = False`
# saves that time.

# %%
refused = []
for indices in ([0, 0], [0, 1]):  # repeated indices, then distinct ones
    try:
        torch.zeros(3).put_(torch.tensor(indices), torch.tensor([1.0, 2.0]))
    except RuntimeError as err:
        refused.append(indices)
        print(f"put_ at {indices}: {type(err).__name__}: {str(err).split(',')[0]}")
torch.zeros(3).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]), accumulate=True)  # allowed
assert refused == [[0, 0], [0, 1]]
torch.use_deterministic_algorithms(True, warn_only=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.zeros(3).put_(torch.tensor([0, 1]), torch.tensor([1.0, 2.0]))
print(f"with warn_only=True: {caught[0].category.__name__}: {str(caught[0].message).split(',')[0]}")
assert caught and issubclass(caught[0].category, UserWarning)
torch.use_deterministic_algorithms(True)
print("torch.empty(3) in deterministic mode:", torch.empty(3))
print("fill_uninitialized_memory:", torch.utils.deterministic.fill_uninitialized_memory)
assert torch.isnan(torch.empty(3)).all() and torch.utils.deterministic.fill_uninitialized_memory
seed_everything(0, deterministic=False)
assert not torch.are_deterministic_algorithms_enabled()

# %% [markdown]
# ### 2.1 cuBLAS and `CUBLAS_WORKSPACE_CONFIG`
#
# Many guides, and PyTorch's own documentation until 2025, say that deterministic mode on CUDA also needs the
# environment variable `CUBLAS_WORKSPACE_CONFIG=:4096:8` (or `:16:8`), set before the process's first cuBLAS call;
# older PyTorch releases made every cuBLAS matrix product raise a `RuntimeError` in deterministic mode without it.
# The reason was NVIDIA's: when several CUDA streams share one cuBLAS workspace, cuBLAS may pick different
# internal implementations, so results can differ between runs; each stream needs a workspace of its own.
# PyTorch has given each cuBLAS handle and stream its own workspace (`cublasSetWorkspace`) since 2022, which is
# what NVIDIA asks for, so in late 2025 it dropped the requirement and the check (pull request #161749). In
# PyTorch 2.14 the variable only sets the size of those workspaces, read once at the first cuBLAS call;
# `torch.backends.cuda.cublas_workspace_size(n)` changes it at run time. This course does not set it.
#
# The check below tests what it can. Everywhere: `use_deterministic_algorithms`' documentation no longer names the
# variable, and the run-time setter exists. On a GPU, in a fresh Python process (so that nothing has touched cuBLAS
# yet) whose environment lacks the variable: deterministic mode runs a cuBLAS matrix product instead of raising,
# and the same product computed on two CUDA streams at once gives the same bits as on the default stream.

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
    probe = """
import torch
torch.use_deterministic_algorithms(True)
a = torch.randn(2048, 2048, device="cuda")
reference = a @ a  # older releases raised RuntimeError here without the variable
streams = [torch.cuda.Stream(), torch.cuda.Stream()]
for s in streams:
    s.wait_stream(torch.cuda.current_stream())
results = []
for _ in range(4):
    for s in streams:
        with torch.cuda.stream(s):
            results.append(a @ a)
torch.cuda.synchronize()
print(all(torch.equal(r, reference) for r in results))
"""
    env = {key: value for key, value in os.environ.items() if key != "CUBLAS_WORKSPACE_CONFIG"}
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    print(
        "fresh process without the variable, deterministic mode: matmul ran:",
        result.returncode == 0,
        "| two streams, same bits as the default stream:",
        result.stdout.strip(),
    )
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr[-1000:]
else:
    print(
        f"{device.type.upper()} run: no cuBLAS here, so neither GPU claim (no RuntimeError without the variable; "
        "the same bits on two CUDA streams) is checked"
    )

# %% [markdown]
# ## 3. Proof: two runs, identical parameters, and what breaks it
#
# With every generator seeded, two training runs (random initialisation, a shuffled loader, `Dropout`) give
# **bit-for-bit** (逐位一致) identical parameters. Consuming a single extra random number anywhere (a debugging
# `torch.randn`, one more augmentation, a layer added and removed) shifts every later draw, and the run diverges;
# a loader with its own `generator` is at least immune to what happens to the global generator.


# %%
def train_once(seed, extra_draw=False):
    seed_all(seed)
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


seed_all(0)
own_order = shuffled_order(torch.Generator().manual_seed(0))
torch.randn(1)  # the same extra draw
print(
    "loader with its own generator, after an extra global draw, same order:",
    shuffled_order(torch.Generator().manual_seed(0)) == own_order,
)
assert shuffled_order(torch.Generator().manual_seed(0)) == own_order

# %% [markdown]
# ### 3.1 The order of additions
#
# Even with identical random numbers, bit-for-bit results need the same **order of floating-point operations**
# (浮点运算顺序). Float addition is not associative: `(a + b) + c` and `a + (b + c)` can round differently. That
# is what a parallel computation changes. One thread sums a vector from start to end; two threads each sum one
# half and then add the two partial sums. The cell below does both by hand, in exact float32 arithmetic
# (NumPy's `float32` scalars), so the result is the same on every machine:

# %%
big, one = torch.tensor(1e8), torch.tensor(1.0)
left, right = (big + one) - big, (big - big) + one
print(f"float32: (1e8 + 1) - 1e8 = {left.item():.0f} | (1e8 - 1e8) + 1 = {right.item():.0f}")
assert left != right


def sequential_sum(values):
    total = np.float32(0)
    for v in values:
        total = total + v  # float32 + float32, rounded to float32 after every step
    return total


values = torch.rand(4096, generator=torch.Generator().manual_seed(0)).numpy()
one_thread = sequential_sum(values)
two_threads = sequential_sum(values[:2048]) + sequential_sum(values[2048:])
print(f"one pass: {one_thread:.4f} | two halves, then added: {two_threads:.4f}")
print(
    f"difference: {abs(float(one_thread) - float(two_threads)):.1e}, relative: {abs(one_thread / two_threads - 1):.0e}"
)
assert one_thread != two_threads and abs(one_thread / two_threads - 1) < 1e-5

# %% [markdown]
# ### 3.2 Threads, batch size, vector instructions and devices
#
# Real kernels make such choices all the time. The cell below runs a few operations of PyTorch on this machine
# and changes one thing at a time:
#
# * the **thread count** (`torch.set_num_threads(n)`; a reduction such as `sum` splits its input among the
#   threads, and a BLAS library may split a matrix product differently);
# * the **batch size**: the same sample alone or in a batch of 64 (a matrix library uses other kernels, blockings
#   and summation orders for other shapes);
# * the **vector instructions** (指令集) of the CPU: ATen, PyTorch's kernel library, picks AVX2, AVX-512 or
#   ARM kernels at start-up (`torch.backends.cpu.get_cpu_capability()` names the set it picked); the variable
#   `ATEN_CPU_CAPABILITY=default` makes a fresh process use its generic kernels instead (this part starts a fresh
#   Python, a few seconds);
# * the **device**: on a GPU, the same matrix product on the GPU and on the CPU.
#
# Which of these change the bits depends on your CPU, your libraries and the sizes, so this cell's output is not
# the same on every machine. (The output stored with this notebook came from a run pinned to one thread, so its
# first line says 1; on your machine it shows the default, about one thread per core.) It asserts what holds everywhere: with the thread count fixed, each operation repeats
# bit for bit, and every difference is a rounding difference, tiny next to the numbers involved (for the sum of
# two million numbers: below a millionth of the sum of their absolute values).

# %%
# NBVAL_IGNORE_OUTPUT
threads_before = torch.get_num_threads()
print("threads this process uses by default:", threads_before)
g = torch.Generator().manual_seed(0)
a, w = torch.randn(512, 512, generator=g), torch.randn(512, 512, generator=g)
x = torch.randn(2_000_000, generator=g)
images, kernel = torch.randn(8, 16, 32, 32, generator=g), torch.randn(32, 16, 3, 3, generator=g)
sum_tol = 1e-6 * x.abs().sum().item()  # rounding differences of a 2-million-term sum stay far below this
operations = {"matmul": lambda: a @ w, "sum": lambda: x.sum(), "conv2d": lambda: F.conv2d(images, kernel)}
by_threads = {}
for n in (1, 2):
    torch.set_num_threads(n)
    by_threads[n] = {name: op() for name, op in operations.items()}
    assert all(torch.equal(op(), by_threads[n][name]) for name, op in operations.items()), "repeats at n threads"
torch.set_num_threads(threads_before)
for name in operations:
    diff = (by_threads[1][name] - by_threads[2][name]).abs().max().item()
    print(f"{name:7} 1 thread vs 2 threads: {'identical' if diff == 0 else f'differ, by at most {diff:.1e}'}")
    atol = sum_tol if name == "sum" else 1e-3  # matmul and conv2d: each output adds up a few hundred products
    assert torch.allclose(by_threads[1][name], by_threads[2][name], rtol=1e-4, atol=atol)

batch = torch.randn(64, 512, generator=g)
alone, in_batch = batch[:1] @ w, (batch @ w)[:1]
diff = (alone - in_batch).abs().max().item()
print(f"one sample alone vs in a batch of 64: {'identical' if diff == 0 else f'differ, by at most {diff:.1e}'}")
assert torch.allclose(alone, in_batch, rtol=1e-4, atol=1e-3)

script = "import torch; x = torch.randn(2_000_000, generator=torch.Generator().manual_seed(0)); print(x.sum().item())"
fresh = subprocess.run(
    [sys.executable, "-c", script], env={**os.environ, "ATEN_CPU_CAPABILITY": "default"}, capture_output=True, text=True
)
generic, here = float(fresh.stdout), torch.randn(2_000_000, generator=torch.Generator().manual_seed(0)).sum().item()
print(f"sum with the {torch.backends.cpu.get_cpu_capability()} kernels: {here:.6f} | generic kernels: {generic:.6f}")
assert fresh.returncode == 0 and abs(generic - here) < sum_tol

if device.type != "cpu":
    on_device = (a.to(device) @ w.to(device)).cpu()
    diff = (on_device - a @ w).abs().max().item()
    print(f"matmul on {device.type} vs CPU: {'identical' if diff == 0 else f'differ, by at most {diff:.1e}'}")
    assert torch.allclose(on_device, a @ w, rtol=1e-3, atol=1e-2)

# %% [markdown]
# Small as they are, such differences grow during training: a different last bit in one step gives slightly
# different weights, every later step starts from those, and after a few epochs two runs differ in their loss
# curves and final accuracy. So PyTorch promises **no** bit-for-bit reproducibility, not even on one machine: its
# reproducibility guide (<https://docs.pytorch.org/docs/stable/notes/randomness.html>) says completely
# reproducible results are not guaranteed across releases, platforms or devices, and offers steps that *limit*
# the sources of non-determinism. What you can get, as §3 shows, is this: **the same machine, the same software,
# the same thread count and batch sizes, every generator seeded, deterministic algorithms on and
# `cudnn.benchmark` off**; then the operations PyTorch covers repeat bit for bit. A few more places to look:
#
# * **Threads you did not choose.** PyTorch uses one thread per physical core unless told otherwise
#   (`OMP_NUM_THREADS`, `torch.set_num_threads`); `torchrun` sets `OMP_NUM_THREADS=1`, with a warning, when it
#   starts more than one process per machine (notebook 08). Record the thread count with the result.
# * **`torch.compile`** (notebook 11) generates its own kernels, which round differently from eager code, and may
#   choose among candidate kernels by timing them on the device. `TORCHINDUCTOR_DETERMINISTIC=1` turns that
#   timing off; `TORCHINDUCTOR_BATCH_INVARIANT=1` asks for kernels whose result for one sample does not depend on
#   the batch size (both read from the environment in `torch/_inductor/config.py`).
# * **Several processes.** In distributed training each rank seeds itself, usually `seed + rank`, so that ranks
#   draw different noise; notebook 08 does that, and notebook 06 saves every generator's state with a checkpoint
#   (Exercise 3 below).
# * **Comparing across machines**: compare with a tolerance (`torch.allclose`, or a metric within its run-to-run
#   spread), never with `==`.

# %% [markdown]
# ## 4. Environment checks
#
# Report the versions and switches with every result you want to reproduce. On a GPU machine:
# `torch.version.cuda` is the CUDA version PyTorch was **built** with (Linux pip wheels pull in the CUDA runtime,
# cuBLAS and cuDNN as `nvidia-*` packages, so only the NVIDIA driver must be installed),
# `torch.backends.cudnn.version()` the cuDNN version, `torch.cuda.get_device_name(i)` each GPU. A container image
# pins all of this at once: PyTorch's official Docker images come as `-runtime` (enough to run PyTorch) and
# `-devel` (which adds the CUDA compiler `nvcc`, needed to build CUDA extensions).
#
# **TF32** (a faster, less precise float32 on NVIDIA Ampere and later GPUs, notebook 07, §4) was on by default for
# matrix products in PyTorch 1.7 to 1.11 only; for cuDNN convolutions it still is. Those switches and the thread
# count (printed in §3.2) belong with every result too.

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
# restart, run its first cell and go on. `make progress` (without make, e.g. on Windows: `python tools/course.py
# progress`) lists which exercises of every notebook pass.

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
# Section 1 seeds every generator and shows what a DataLoader draws (§1.3); section 3 shows what one extra draw
# does. For each pair below, on the CPU, are `a` and `b` identical? Predict before running anything.
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
# seed, other orders), whatever else the program draws. It must never reseed or draw from a global generator
# (torch's, NumPy's or Python's), not even once per epoch; that is also what makes worker processes repeat
# (sections 1.3 and 3).


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
# ([notebook 06](06_save_load_checkpoints.ipynb), §5). Write
# `rng_snapshot()`, which returns the current states of Python's `random`, NumPy's global generator, torch's CPU
# generator and, when CUDA is available, every GPU's; and `rng_restore(snapshot)`, which puts them back, so that
# the draws after a restore are the draws that followed the snapshot. The snapshot goes into a checkpoint, so it
# must survive `torch.save` and `torch.load(..., weights_only=True)` ([notebook 06](06_save_load_checkpoints.ipynb),
# §4): the check saves and loads it before restoring. Keep it plain data: `rng_restore` must not unpickle anything
# (that would reopen the hole `weights_only=True` closes). (`utils.checkpoint_files` has such functions; write your
# own.)


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
# * A seed sets a generator's state. Seed every global generator with one seed: `random.seed`, `np.random.seed`,
#   `torch.manual_seed` (which also seeds every GPU). Generator objects (`np.random.default_rng`,
#   `torch.Generator`) are not touched by that: create each from the run's seed. `PYTHONHASHSEED` works only in
#   the environment that starts Python.
# * A `DataLoader` shuffles with its `generator` and draws its workers' seeds from it: give it a generator of its
#   own, seeded from the run's seed (§1.3), and a `worker_init_fn` such as `seed_worker` for other libraries in the
#   workers.
# * `torch.use_deterministic_algorithms(True)` picks deterministic kernels (cuDNN's included) and raises where there
#   are none; also set `cudnn.benchmark = False`. `CUBLAS_WORKSPACE_CONFIG`, which older releases demanded, is no
#   longer needed in PyTorch 2.14.
# * One extra random draw shifts every later draw. The order of floating-point additions changes the last bits, and
#   the thread count, the batch size, the CPU's vector instructions and the device all change that order; training
#   amplifies the difference. PyTorch guarantees no bit-for-bit reproducibility; on one machine, with the same
#   software, thread count and batch sizes, seeds and deterministic mode, the operations it covers repeat.
# * Record versions (Python, torch, CUDA, cuDNN, GPU), the thread count and the TF32 switches with every result;
#   compare runs across machines with a tolerance.

# %% [markdown]
# ## For readers of the original notes (原笔记勘误)
#
# This lesson was built from a teacher's study notes, written in Chinese for PyTorch 1.x (the seeding recipe of
# 其他技巧 › 重现, and the cookbook's 可复现性 section). If you have them, this table lists what they say that no
# longer holds, or never quite held, and where the lesson shows today's behaviour.
#
# | What the notes say | What holds in PyTorch 2.14 | Where this lesson shows it |
# |---|---|---|
# | `torch.set_deterministic(True)`, new in PyTorch 1.7. | Renamed `torch.use_deterministic_algorithms(True)` in 1.8; `set_deterministic` is gone. | §2 · Deterministic algorithms |
# | `seed_torch` sets `os.environ['PYTHONHASHSEED'] = str(seed)`. | Python reads the variable only at start-up: set inside the program it changes nothing. Set it in the environment that starts Python. | §1.1 · `PYTHONHASHSEED`: set before Python starts |
# | `seed_torch` calls `torch.manual_seed`, `torch.cuda.manual_seed` and `torch.cuda.manual_seed_all`. | `torch.manual_seed` already seeds every CUDA (and MPS) device; the other two calls are redundant. | §1 · One seed for every generator |
# | Fix torch's and NumPy's seeds and the run is reproducible. | Python's `random`, NumPy `Generator` objects (`default_rng`), and the DataLoader's generator and worker seeds need seeding too. | §1; §1.2 · Generator objects; §1.3 · DataLoader workers |
# | The cookbook sets `cudnn.benchmark = True` *and* `cudnn.deterministic = True` ("benchmark is for speed, deterministic for reproducibility"). | `benchmark = True` chooses convolution algorithms by timing them, which can change the result from run to run: set it to `False` when results must repeat. `use_deterministic_algorithms(True)` implies `cudnn.deterministic`. | §2 |
# | "On the same device, reproducibility should be guaranteed" (cookbook, 可复现性). | PyTorch guarantees it nowhere. The thread count, the batch size, the vector instructions and the chosen kernels change the last bits on one machine; with those fixed, plus seeds, deterministic mode and `benchmark = False`, the operations PyTorch covers repeat. | §3.1 · The order of additions; §3.2 · Threads, batch size, vector instructions and devices |
# | TF32 is on by default for matrix products. | True for PyTorch 1.7 to 1.11 only; off for matrix products since 1.12, still on for cuDNN convolutions. | §4 · Environment checks |
