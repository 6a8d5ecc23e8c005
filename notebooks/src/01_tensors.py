# %% [markdown]
# # 01 · Tensors (张量)
#
# A **tensor** (张量) is PyTorch's n-dimensional array: the numbers a model reads, computes with and learns. This
# lesson first teaches the everyday operations a NumPy user looks for, then the places where tensors behave
# differently from what one expects: how their memory is laid out, which operations share it, and which dtype a
# mixed computation returns.
#
# **You will learn to:**
# - create tensors from data or by shape (`zeros`, `arange`, `rand`, `*_like`, ...) with the `dtype` and
#   `device` you want, and know which dtype PyTorch infers;
# - predict the dtype of a mixed computation (type promotion), and avoid the silent wrap-around of integer
#   arithmetic, e.g. on `uint8` images;
# - reduce (`sum(dim=..., keepdim=...)`), join (`cat`, `stack`), reorder (`permute`, `unsqueeze`, `flatten`) and
#   index tensors, and tell when an index gives a view and when a copy;
# - read how a shape is laid over memory (storage and strides) and predict when `view` works, when `reshape`
#   copies, and why `.contiguous().view()` is not the same as `reshape`;
# - share memory with NumPy and images knowingly (which conversions copy and which do not);
# - broadcast, multiply matrices and vectors (`@`, `einsum`), compare floats, name dimensions with einops, and
#   move tensors to an accelerator (`torch.accelerator`);
# - practise all of it in three self-checking exercises at the end.
#
# **You should know:** Python and a little NumPy. **Study time:** about 110 min: about 90 to read and run the
# eleven sections, 15–20 for the exercises (less if you know NumPy well). The cells run in seconds.
# **On a GPU:** the last section moves tensors to `cuda`; everything else is the same.
#
# This course grew out of a teacher's study notes written for PyTorch 1.x. The lesson stands on its own; if you
# know those notes, the closing section lists what they say that no longer holds.
#
# Every lesson's first code cell is its **setup cell**: it does nothing when the notebook runs inside the course,
# and fetches the course first when the notebook was opened alone (in Colab, say), from the repository the course
# names (or the one in the environment variable `TORCH_COURSE_REPOSITORY`); there the first run also installs the
# packages the course pins, which takes a few minutes. The next cell imports the
# libraries. `seed_everything(0)` (from the course's small `utils` package) seeds Python's, NumPy's and PyTorch's
# random numbers, so that a rerun draws the same numbers; notebook 12 explains seeding.

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

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F

from utils import seed_everything

seed_everything(0)
print("torch", torch.__version__.split("+")[0])

# %% [markdown]
# ## 1. Creating tensors (创建张量)
#
# `torch.tensor(data)` copies Python lists (or a NumPy array) into a new tensor. Most tensors, though, are made by
# shape: `zeros`, `ones`, `full` (one value everywhere), `arange` (a range, end excluded, like `range()`),
# `linspace` (a number of evenly spaced points, both ends included), `eye` (the identity matrix), `rand` (uniform
# in [0, 1)) and `randn` (standard normal). Every creation function takes `dtype=` and `device=` (create a tensor
# where it will be used rather than moving it later). `zeros`, `ones`, `full`, `empty`, `rand`, `randn` and
# `randint` (random integers) have a `*_like` twin that copies shape, dtype and device from another tensor
# (`arange`, `linspace` and `eye` have none). `empty` only allocates: its values are whatever was in memory, so
# write before you read.
#
# Two helpers appear in the cell before their own sections: `t.tolist()` turns a tensor into Python lists (for
# printing; section 5), and `torch.Generator().manual_seed(0)` is a random-number stream of its own, seeded so
# that its draws are the same on every run whatever else the notebook draws (`rand` and `randn` take it as
# `generator=`).

# %%
made = {
    "torch.zeros(2, 3)": torch.zeros(2, 3),
    "torch.ones(2, dtype=torch.int64)": torch.ones(2, dtype=torch.int64),
    "torch.full((2,), 7.0)": torch.full((2,), 7.0),
    "torch.arange(0, 10, 3)": torch.arange(0, 10, 3),  # end excluded, like range()
    "torch.linspace(0, 1, 5)": torch.linspace(0, 1, 5),  # 5 points, both ends included
    "torch.eye(2)": torch.eye(2),
}
for name, t in made.items():
    print(f"{name:33} {t.dtype}  {t.tolist()}")
g = torch.Generator().manual_seed(0)
u, n = torch.rand(1000, generator=g), torch.randn(1000, generator=g)  # uniform [0, 1) and standard normal
like = torch.zeros_like(n, dtype=torch.int32)
print(
    f"rand: min {u.min():.4f} max {u.max():.4f} | randn: mean {n.mean():.1f} std {n.std():.1f} | "
    f"zeros_like: shape {tuple(like.shape)}, {like.dtype}"
)
assert 0 <= u.min() and u.max() < 1 and abs(n.mean()) < 0.1 and abs(n.std() - 1) < 0.1
assert torch.empty(2, 3).shape == (2, 3)  # allocated, not initialised: never read before writing
half = torch.zeros(2, 3, dtype=torch.float16, device="cpu")  # section 11 picks a GPU when there is one
print(
    "zeros(2, 3, dtype=torch.float16, device='cpu'):",
    half.dtype,
    half.device,
    "| ones_like keeps both:",
    torch.ones_like(half).dtype,
    torch.ones_like(half).device,
)
assert torch.ones_like(half).dtype == torch.float16 and torch.ones_like(half).device == half.device

# %% [markdown]
# ## 2. Data types (数据类型)
#
# Every tensor has one **data type** (数据类型), its `dtype`. They map almost one-to-one onto NumPy's dtypes (there is no
# string tensor). Neural networks compute in `float32` by default; `int64` ("long") is the type of class labels and
# indices; `uint8` the type of image pixels; `bool` the type of masks. `float16` and `bfloat16` are the
# half-precision types of mixed-precision training (notebook 07).
#
# Before PyTorch 0.4 a tensor's type was a class per dtype and device, `torch.FloatTensor`, `torch.LongTensor`,
# `torch.cuda.FloatTensor`, ... Those names survive in older code and in `t.type()` without an argument, which
# returns the name as a string. The last column shows them. The cell converts a NumPy array of each dtype with
# `torch.from_numpy(array)`, which makes a tensor on the array's memory (section 5 teaches it).

# %%
pairs = [
    (torch.float64, np.float64),
    (torch.float32, np.float32),
    (torch.float16, np.float16),
    (torch.int64, np.int64),
    (torch.int32, np.int32),
    (torch.int16, np.int16),
    (torch.int8, np.int8),
    (torch.uint8, np.uint8),
    (torch.bool, np.bool_),
]
for t_dtype, np_dtype in pairs:
    converted = torch.from_numpy(np.zeros(1, dtype=np_dtype)).dtype
    assert converted == t_dtype
    legacy_name = torch.zeros(1, dtype=t_dtype).type()
    print(f"{str(t_dtype):15} <-> numpy.{np.dtype(np_dtype).name:8} {t_dtype.itemsize} byte(s)   {legacy_name}")
print("aliases: torch.float is", torch.float, "| torch.double is", torch.double, "| torch.long is", torch.long)
assert torch.float is torch.float32 and torch.double is torch.float64 and torch.long is torch.int64
assert torch.zeros(1, dtype=torch.int8).type() == "torch.CharTensor"

# %% [markdown]
# PyTorch **infers** the dtype from the Python value: an integer becomes `int64`, a float becomes `float32`
# (not `float64` as in NumPy!), a boolean becomes `bool`. Pass `dtype=` to choose.

# %%
for value in (1, 2.0, True):
    t = torch.tensor(value)
    print(f"torch.tensor({value!r:5}) -> {t}  {t.dtype}")
print("numpy infers", np.array(2.0).dtype, "but torch infers", torch.tensor(2.0).dtype)
print(torch.tensor(1, dtype=torch.int32), torch.tensor(2.0, dtype=torch.double))

# %% [markdown]
# **A trap in older code: the legacy constructors.** `torch.IntTensor(1)`, `torch.FloatTensor(2, 3)` and
# `torch.Tensor(3)` look as if they stored the numbers 1, or 2 and 3. With integer arguments they *allocate*: a
# tensor of that shape holding whatever bytes were in memory. Print one and you may see `tensor([5])` or
# `tensor([-637404160])`: garbage, different from run to run. Given a list or an array they do copy it
# (`torch.BoolTensor([1, 0, 2, 0])` is `[True, False, True, False]`), which makes the trap worse. Use
# `torch.tensor(data)` to store data, and `torch.empty/zeros/ones(size)` to allocate. (`t.item()` in the cell reads
# a one-element tensor as a Python number; section 5.)

# %%
legacy = torch.IntTensor(1)  # a tensor of shape (1,) with whatever was in memory
modern = torch.tensor([1], dtype=torch.int32)
print("torch.IntTensor(1).shape =", tuple(legacy.shape), "  (its value is undefined)")
print("torch.tensor([1], dtype=torch.int32) =", modern)
assert legacy.shape == modern.shape == (1,) and modern.item() == 1
print("torch.BoolTensor([1, 0, 2, 0]) =", torch.BoolTensor([1, 0, 2, 0]).tolist(), "(a list is copied)")
assert torch.equal(torch.BoolTensor([1, 0, 2, 0]), torch.tensor([1, 0, 2, 0], dtype=torch.bool))

# %% [markdown]
# Converting between dtypes: `.float()`, `.long()`, ... or `.to(dtype)` (the general form, which also moves
# devices), `.type(dtype)` (with an argument it converts; without one it returns the legacy name above), and
# `.type_as(other)` (take the dtype of another tensor). Converting a float to an integer type **truncates toward
# zero**.

# %%
i = torch.tensor(1)
x = i.float()
print(x, x.dtype, "|", i.type(torch.float16).dtype, "|", i.to(torch.float64).dtype, "|", i.type_as(x).dtype)
print(torch.tensor([-1.7, 1.7]).long())

# %% [markdown]
# The default float dtype is `float32`: it is what `torch.tensor(2.0)`, `zeros` and `rand` make.
# `torch.set_default_dtype` changes it and `torch.set_default_device` the default device. Older code calls
# `torch.set_default_tensor_type(torch.FloatTensor)` instead, which has been deprecated since PyTorch 2.1 and warns.
# The cell shows the warning with the course's `show_warning(fn, category, match)` from `utils`: it runs `fn()`
# inside Python's `warnings.catch_warnings(record=True)`, which collects warnings in a list instead of printing
# them, checks that a `category` warning containing `match` was raised, and prints its first sentence. PyTorch
# prints many of its warnings only once per session; `torch.set_warn_always(True)` makes it repeat them, so the
# cell shows the warning each time it runs (it also helps when you hunt a warning in your own code).
#
# That line was usually there for speed, and rightly so: `float64` is much slower than `float32`. Its numbers are
# twice as large, so a CPU's vector instructions process half as many per step and every transfer moves twice the
# bytes; consumer GPUs run `float64` at 1/32 to 1/64 of their `float32` rate, and Apple's MPS has no `float64` at
# all. The second cell times one matrix product of each dtype on one CPU thread (the best of 20 runs; a timing
# depends on the machine, so your numbers will differ).

# %%
from utils import show_warning

torch.set_warn_always(True)  # PyTorch shows this warning once per session; show it each time the cell runs
show_warning(lambda: torch.set_default_tensor_type(torch.FloatTensor), UserWarning, "set_default_tensor_type()")
torch.set_warn_always(False)
print("default dtype:", torch.get_default_dtype())
assert torch.get_default_dtype() == torch.float32

# %%
# NBVAL_IGNORE_OUTPUT
import time


def best_time(dtype, n=256, runs=20):
    a, b = torch.rand(n, n, dtype=dtype), torch.rand(n, n, dtype=dtype)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return min(times)


threads = torch.get_num_threads()
torch.set_num_threads(1)  # one thread: the comparison is not blurred by how threads are scheduled
try:
    t32, t64 = best_time(torch.float32), best_time(torch.float64)
finally:
    torch.set_num_threads(threads)
print(f"256 x 256 matmul: float32 {t32 * 1e3:.2f} ms, float64 {t64 * 1e3:.2f} ms -> float64 {t64 / t32:.1f}x slower")
assert t64 > 1.2 * t32

# %% [markdown]
# ### Mixing dtypes: type promotion (类型提升)
#
# When an operation mixes dtypes, PyTorch computes one result dtype by **type promotion** (类型提升). The rules,
# which `torch.result_type(a, b)` applies for you (the documentation states them under
# [Type promotion](https://docs.pytorch.org/docs/stable/tensor_attributes.html#type-promotion-doc)):
#
# 1. The dtypes fall into **categories**: bool < integer < floating point < complex. The result takes the highest
#    category among the operands.
# 2. Within that category, tensors **with at least one dimension** decide the size: `int32` with `int64` gives
#    `int64`, `float16` with `float32` gives `float32`.
# 3. A **Python number or a 0-d tensor** (a scalar, section 3) changes the result only if it brings a higher
#    category: `float16_tensor + 1.5` stays `float16`, and a `float32` tensor times a `float64` 0-d tensor stays
#    `float32`. An `int64` tensor times `2.5` becomes a float: the default `float32` for a Python float, `float64`
#    for a `float64` 0-d tensor.
# 4. True division `/` of integers returns the default float dtype; floor division `//` stays an integer.
#
# Rule 3 hides the most common dtype bug. Images arrive as `uint8` (0 to 255), and `100` is a Python number, so
# `uint8_tensor + 100` is computed *in* `uint8`, where arithmetic wraps around modulo 256: `200 + 100` gives `44`
# and `10 - 20` gives `246`, without an error or a warning.

# %%
u8 = torch.tensor([200, 10], dtype=torch.uint8)  # two pixel values
i64 = torch.tensor([1, 2, 3])
f16, f32 = torch.ones(2, dtype=torch.float16), torch.ones(2)
f64_scalar = torch.tensor(2.0, dtype=torch.float64)  # a 0-d tensor
mixed = {
    "u8 + 100": u8 + 100,
    "u8 - 20": u8 - 20,
    "i64 / 2": i64 / 2,
    "i64 // 2": i64 // 2,
    "i64 * 2.5": i64 * 2.5,
    "i64.int() + i64": i64.int() + i64,
    "f16 + 1.5": f16 + 1.5,
    "f16 + f32": f16 + f32,
    "f32 * f64_scalar": f32 * f64_scalar,
    "i64 * f64_scalar": i64 * f64_scalar,
}
for expr, t in mixed.items():
    print(f"{expr:17} -> {str(t.dtype):14} {t.tolist()}")
assert (u8 + 100).tolist() == [44, 110] and (u8 - 20).tolist() == [180, 246]  # wrapped modulo 256
assert [t.dtype for t in mixed.values()] == [
    *(torch.uint8, torch.uint8, torch.float32, torch.int64, torch.float32, torch.int64),
    *(torch.float16, torch.float32, torch.float32, torch.float64),
]
print(
    "torch.result_type(u8, 100) =",
    torch.result_type(u8, 100),
    "| torch.result_type(i64, 2.5) =",
    torch.result_type(i64, 2.5),
    "| torch.promote_types(torch.uint8, torch.int8) =",
    torch.promote_types(torch.uint8, torch.int8),
)
assert torch.result_type(u8, 100) == torch.uint8 and torch.promote_types(torch.uint8, torch.int8) == torch.int16

# %% [markdown]
# The fix is to convert *before* the arithmetic: `.float()` (usually what a model wants anyway) or a wider
# integer type. Two related rules. `sum()` (a reduction, section 3) of an integer or bool tensor returns `int64`,
# so `u8.sum()` and a mask's `sum()` count correctly, while `mean()` refuses integer tensors. And an **in-place
# operation** (原地操作: one that writes into the tensor itself, such as `+=` or a method ending in `_`; section 5
# has more) cannot change a tensor's dtype, so adding `0.5` into an integer tensor raises instead of promoting.

# %%
print(
    "u8.to(torch.int16) + 100 =",
    (u8.to(torch.int16) + 100).tolist(),
    "| u8.float() + 100 =",
    (u8.float() + 100).tolist(),
)
print("u8.sum() =", u8.sum().item(), u8.sum().dtype, "| u8.float().mean() =", u8.float().mean().item())
assert u8.sum().item() == 210 and u8.sum().dtype == torch.int64
try:
    u8.mean()
except RuntimeError as err:
    print("u8.mean()  -> RuntimeError:", str(err).splitlines()[0])
try:
    i64 += 0.5
except RuntimeError as err:
    print("i64 += 0.5 -> RuntimeError:", err)
assert i64.tolist() == [1, 2, 3]  # unchanged: the in-place add was refused

# %% [markdown]
# ## 3. Dimensions and shapes (维度与尺寸)
#
# The number of dimensions is the number of nested brackets: a **scalar** (标量) is 0-D, a vector 1-D, a matrix
# 2-D, a colour image 3-D (channels, height, width), a batch of images or a video 4-D (frames, channels, height,
# width). `t.dim()` counts dimensions; `t.shape` (an attribute) and `t.size()` (a method) give the same
# `torch.Size`, and `t.numel()` counts the elements. A scalar's shape is empty, `torch.Size([])`.

# %%
examples = {
    "scalar": torch.tensor(True),
    "vector": torch.tensor([1.0, 2.0, 3.0, 4.0]),
    "matrix": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
    "RGB image (C, H, W)": torch.zeros(3, 32, 32),
    "video (T, C, H, W)": torch.zeros(16, 3, 32, 32),
}
for name, t in examples.items():
    assert t.shape == t.size()
    print(f"{name:20} dim={t.dim()} shape={tuple(t.shape)} numel={t.numel()}")
assert examples["scalar"].shape == torch.Size([])

# %% [markdown]
# ### Reductions, joining and reordering dimensions
#
# A **reduction** (归约) (`sum`, `mean`, `max`, `argmax`, ...) over `dim=d` removes dimension `d`; `keepdim=True`
# keeps it with size 1, so that the result still combines with the input by **broadcasting** (广播, section 7),
# e.g. to subtract each row's mean. `cat` joins tensors along an existing dimension, `stack` along a new one.
# `unsqueeze(d)` adds a dimension of size 1, `squeeze(d)` removes one, `permute` reorders all of them, and
# `flatten(start_dim, end_dim)` merges the dimensions from `start_dim` to `end_dim` (both included; by default
# all of them) into one.
#
# The cell builds its matrix with `torch.arange(6.0).view(2, 3)`: `view` reads the same six numbers as 2 rows of
# 3 (section 4 explains how, and when it works). `t.item()` turns a one-element tensor into a Python number
# (section 5).

# %%
m = torch.arange(6.0).view(2, 3)
print("m =", m.tolist())
print("m.sum() =", m.sum().item(), "| m.sum(dim=0) =", m.sum(dim=0).tolist(), "| m.sum(dim=1) =", m.sum(dim=1).tolist())
print(
    "m.mean(dim=1, keepdim=True) has shape",
    tuple(m.mean(dim=1, keepdim=True).shape),
    "| m - that =",
    (m - m.mean(dim=1, keepdim=True)).tolist(),
)
values, indices = m.max(dim=1)
print("m.max(dim=1): values", values.tolist(), "indices", indices.tolist())
print(
    "cat dim 0:",
    tuple(torch.cat([m, m]).shape),
    "| cat dim 1:",
    tuple(torch.cat([m, m], dim=1).shape),
    "| stack:",
    tuple(torch.stack([m, m]).shape),
)
print(
    "unsqueeze(0):",
    tuple(m.unsqueeze(0).shape),
    "| unsqueeze(0).squeeze(0):",
    tuple(m.unsqueeze(0).squeeze(0).shape),
    "| permute of (2, 3, 4) by (2, 0, 1):",
    tuple(torch.zeros(2, 3, 4).permute(2, 0, 1).shape),
)
t234 = torch.zeros(2, 3, 4)
print(
    "flatten of (2, 3, 4): flatten() ->",
    tuple(t234.flatten().shape),
    "| flatten(1) ->",
    tuple(t234.flatten(1).shape),
    "| flatten(0, 1) ->",
    tuple(t234.flatten(0, 1).shape),
)
assert m.sum(dim=0).tolist() == [3.0, 5.0, 7.0] and m.sum(dim=1).tolist() == [3.0, 12.0]
assert torch.stack([m, m]).shape == (2, 2, 3) and torch.cat([m, m], dim=1).shape == (2, 6)
assert t234.flatten(1).shape == (2, 12) and t234.flatten(0, 1).shape == (6, 4)

# %% [markdown]
# ### Indexing (索引) and boolean masks (布尔掩码)
#
# Tensor **indexing** (索引) works as in NumPy: an integer or a slice `start:stop:step` per dimension, `...` for all the
# remaining dimensions, `None` to insert a dimension of size 1. A list (or tensor) of indices picks arbitrary rows, and
# a **boolean mask** (布尔掩码: a `bool` tensor of the same shape, usually the result of a comparison) picks the elements
# where it is `True`, always as a 1-D tensor. `torch.where(mask, a, b)` chooses element-wise instead.

# %%
x = torch.arange(12).view(3, 4)
print(x)
print(
    "x[1] =",
    x[1].tolist(),
    "| x[:, 1] =",
    x[:, 1].tolist(),
    "| x[1, -1] =",
    x[1, -1].item(),
    "| x[::2, 1:3] =",
    x[::2, 1:3].tolist(),
)
print("x[..., 0].shape =", tuple(x[..., 0].shape), "| x[None].shape =", tuple(x[None].shape))
print("x[[0, 2]] =", x[[0, 2]].tolist(), "| x[x % 5 == 0] =", x[x % 5 == 0].tolist())
print("torch.where(x > 8, x, -1) =", torch.where(x > 8, x, -1).tolist())
assert x[1, -1] == 7 and x[::2, 1:3].tolist() == [[1, 2], [9, 10]] and x[x % 5 == 0].tolist() == [0, 5, 10]

# %% [markdown]
# **Views and copies.** An index made only of integers, slices, `None` and `...` is **basic indexing** (基本索引) and
# returns a **view** (视图): a new tensor on the *same memory* as the original, so writing into it writes into the
# original (section 4 shows how a view describes its elements without copying them). An index with a list or tensor
# of indices, or a mask, is **advanced indexing** (高级索引): it picks arbitrary elements and returns a **copy** (副本).
# One exception: a 0-d integer tensor, such as the `t.argmax()` of a 1-D tensor, acts like a plain integer, so
# `x[torch.tensor(1)]` is a view, while the 1-element list `x[torch.tensor([1])]` is a copy.
# Assigning *through* advanced indexing, `x[mask] = 0`, does write into `x`: an assignment is an in-place
# operation on `x` itself (PyTorch calls `x.index_put_`), not a read followed by a write into the copy.
#
# A silent trap with repeated indices: `counts[[0, 0]] += 1` adds 1 once, not twice. It reads `counts[[0, 0]]` (a
# copy), adds 1, and writes both results into the same element. To accumulate, use
# `counts.index_put_((idx,), values, accumulate=True)` or `counts.index_add_(0, idx, values)`.

# %%
x = torch.arange(12.0).view(3, 4)


def kind(t):  # does t use the same memory block (storage, section 4) as x?
    return "view" if t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() else "copy"


indexed = {
    "x[1]": x[1],
    "x[:, 1:3]": x[:, 1:3],
    "x[None, ..., 0]": x[None, ..., 0],
    "x[torch.tensor(1)]": x[torch.tensor(1)],
    "x[torch.tensor([1])]": x[torch.tensor([1])],
    "x[[0, 2]]": x[[0, 2]],
    "x[x > 6]": x[x > 6],
    "x[[0, 2], None]": x[[0, 2], None],
}
for expr, t in indexed.items():
    print(f"{expr:20} shape {str(tuple(t.shape)):10} {kind(t)}")
assert [kind(t) for t in indexed.values()] == ["view"] * 4 + ["copy"] * 4
row, picked = x[1], x[[0, 2]]
row[0] = -1.0  # writes into x
picked[0, 0] = -2.0  # does not
x[x > 6] = 0.0  # assignment through a mask writes into x
print("x after the writes:", x.tolist())
assert x[1, 0] == -1.0 and x[0, 0] == 0.0 and picked[0, 0] == -2.0 and (x <= 6).all()

idx = torch.tensor([0, 0, 2])
counts = torch.zeros(3)
counts[idx] += 1  # index 0 appears twice but is incremented once
accumulated = torch.zeros(3).index_put_((idx,), torch.ones(3), accumulate=True)
print("counts[idx] += 1 ->", counts.tolist(), "| index_put_(accumulate=True) ->", accumulated.tolist())
assert counts.tolist() == [1, 0, 1] and accumulated.tolist() == [2, 0, 1]
assert torch.equal(torch.zeros(3).index_add_(0, idx, torch.ones(3)), accumulated)

# %% [markdown]
# The last index of the table mixes both kinds: `x[[0, 2], None]` picks rows 0 and 2 (a copy) and then inserts a
# dimension of size 1 after them. Beware of shortcuts that hold only for one shape. For a 1-D `x` it equals
# `x[[0, 2]].view(-1, 1)`, a column; for the 2-D `x` above it is `x[[0, 2]].unsqueeze(1)`, of shape `(2, 1, 4)`,
# while `view(-1, 1)` would pour all eight numbers into one column.

# %%
x1 = torch.tensor([1, 2, 3])
print(
    "1-D:",
    x1.tolist(),
    "[[0, 2], None] ->",
    x1[[0, 2], None].tolist(),
    "| 2-D x (3, 4): x[[0, 2], None] has shape",
    tuple(x[[0, 2], None].shape),
    "but x[[0, 2]].view(-1, 1) has shape",
    tuple(x[[0, 2]].view(-1, 1).shape),
)
assert torch.equal(x1[[0, 2], None], x1[[0, 2]].view(-1, 1))
assert torch.equal(x[[0, 2], None], x[[0, 2]].unsqueeze(1)) and x[[0, 2]].view(-1, 1).shape == (8, 1)

# %% [markdown]
# ## 4. Memory layout: storage, strides, views (存储、步长与视图)
#
# A tensor is a flat block of memory, its **storage** (存储), plus an **offset** (偏移量), a shape and, for each
# dimension, a **stride** (步长): how many elements to skip in the storage to move one step along that dimension.
# Element `[i, j]` of a matrix lives at `offset + i * stride[0] + j * stride[1]`. A view (视图) is a tensor on
# another's storage with its own offset, shape and strides; `view(shape)` makes one without copying (`-1` lets
# PyTorch infer one dimension). Basic indexing is a view for the same reason: `m34[1]` is offset 4 with stride
# `(1,)`, the column `m34[:, 1]` offset 1 with stride `(4,)`. (PyTorch's documentation lists every operation that
# returns a view on its [Tensor Views](https://docs.pytorch.org/docs/stable/tensor_view.html) page.)

# %%
vector = torch.arange(12)
m34 = vector.view(3, 4)
m43 = vector.view(4, -1)
print(m34, "strides", m34.stride())
print("view(4, -1): shape", tuple(m43.shape), "strides", m43.stride())
print(
    "m34[1]: offset",
    m34[1].storage_offset(),
    "strides",
    m34[1].stride(),
    "| m34[:, 1]: offset",
    m34[:, 1].storage_offset(),
    "strides",
    m34[:, 1].stride(),
)
assert m34.untyped_storage().data_ptr() == vector.untyped_storage().data_ptr()  # same memory, no copy
assert m34[2, 1] == vector[2 * m34.stride(0) + 1 * m34.stride(1)]
assert (m34[1].storage_offset(), m34[1].stride()) == (4, (1,))
assert (m34[:, 1].storage_offset(), m34[:, 1].stride()) == (1, (4,))

# %% [markdown]
# ### Transpose and contiguity (转置与连续性)
#
# You will often read that a transpose "scrambles the storage", so that `view` fails afterwards, and that `reshape`
# is shorthand for `.contiguous().view()`. Neither is true, and the truth is simpler. A transpose `t()` moves
# nothing: it swaps the sizes *and* the strides. (`t()` is for matrices; `transpose(dim0, dim1)` swaps any two
# dimensions of a tensor of any rank in the same way, also a view, and `permute` reorders all of them at once.)
# `m62 = m26.t()` has strides `(1, 6)`, so reading it row by row
# jumps around the storage: it is no longer a **contiguous tensor** (连续张量), one whose rows lie one after the
# other in the storage. The figure shows both tensors over the one storage; each cell's colour is its position in
# the storage.

# %%
base = torch.arange(12)
m26 = base.view(2, 6)
m62 = m26.t()
print(
    "sizes",
    tuple(m26.shape),
    "->",
    tuple(m62.shape),
    "| strides",
    m26.stride(),
    "->",
    m62.stride(),
    "| contiguous:",
    m26.is_contiguous(),
    "->",
    m62.is_contiguous(),
)
print("m62 read row by row:", m62.flatten().tolist())
assert m62.stride() == (1, 6) and not m62.is_contiguous()
assert torch.equal(m26.transpose(0, 1), m62) and m26.transpose(0, 1).stride() == m62.stride()
assert all(m62[i, j] == base[i * 1 + j * 6] for i in range(6) for j in range(2))  # the rule the figure draws

fig, axes = plt.subplots(1, 3, figsize=(9, 3.4), gridspec_kw={"width_ratios": [12, 6, 2.4]}, layout="constrained")
panels = (
    ("storage (12 elements)", base.view(1, 12)),
    ("m26 = view(2, 6)\nstrides (6, 1)", m26),
    ("m62 = m26.t()\nstrides (1, 6)", m62),
)
for ax, (title, grid) in zip(axes, panels):
    ax.imshow(grid.numpy(), cmap="viridis", vmin=-4, vmax=15)  # colour = position in the storage
    for (i, j), value in np.ndenumerate(grid.numpy()):
        ax.text(j, i, str(value), ha="center", va="center", color="white", fontsize=11)
    ax.set_title(title, fontsize=11)
    ax.set_xticks([])
    ax.set_yticks([])
fig.suptitle("A transpose re-reads the same storage: down m62 steps 1 element, across it steps 6", fontsize=12)
plt.show()

# %% [markdown]
# **`view` does not need a contiguous tensor.** It needs the *requested shape* to be expressible with strides over
# the existing layout. Take `m62.view(2, 3, 2)`, step by step:
#
# - `m62`'s first dimension has 6 elements, 1 apart in the storage (stride 1). Splitting it into 2 × 3 is easy:
#   the 3 inner ones stay 1 apart (stride 1), and each of the 2 outer steps skips 3 (stride 3).
# - `m62`'s second dimension (stride 6) is kept as it is.
#
# So the view has strides `(3, 1, 6)`: no copy. `m62.view(3, 4)` is impossible: a row of the result would hold
# the elements `0, 6, 1, 7`, which are +6, -5, +6 apart in the storage, and a dimension has only one stride. Only
# then does `view` raise. (The cell computes those steps with `torch.diff`, the differences of neighbouring
# elements.)

# %%
v232 = m62.view(2, 3, 2)  # works on the non-contiguous tensor
print(
    "m62.view(2, 3, 2): strides",
    v232.stride(),
    "| contiguous:",
    v232.is_contiguous(),
    "| on base's storage:",
    v232.untyped_storage().data_ptr() == base.untyped_storage().data_ptr(),
)
assert v232.stride() == (3, 1, 6) and torch.equal(v232.flatten(), m62.flatten())
assert v232.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()  # a view: no copy
try:
    m62.view(3, 4)
except RuntimeError as err:
    print("m62.view(3, 4) ->", type(err).__name__ + ":", err)
print(
    "a row of (3, 4) would be",
    m62.flatten()[:4].tolist(),
    "-> steps in the storage:",
    torch.diff(m62.flatten()[:4]).tolist(),
)
assert torch.diff(m62.flatten()[:4]).tolist() == [6, -5, 6]

# %% [markdown]
# **`reshape` and `.contiguous().view()` agree in values only.** `reshape` returns a view whenever one exists and
# copies only when it must. `contiguous()` copies every non-contiguous tensor (and returns the tensor itself when
# it is already contiguous), so `.contiguous().view()` copies even where a view would have done. The cell tells a
# view from a copy by comparing storages, as before.
#
# You may meet another test in code: `t._base`, a private attribute that autograd uses. It is set on the result
# of a *view operation* (`view`, slicing, `t()`, ...) and points at the tensor whose memory the view reads (the
# first one, for a view of a view); on every other tensor it is `None`. So it is not a test of shared memory:
# `x.detach()` (section 9) and `torch.from_numpy(a)` (section 5) share memory and have `_base is None`. Compare
# storages, as the cells do.

# %%
results = {
    "m62.reshape(2, 3, 2)": m62.reshape(2, 3, 2),
    "m62.contiguous().view(2, 3, 2)": m62.contiguous().view(2, 3, 2),
    "m62.reshape(3, 4)": m62.reshape(3, 4),
    "m62.contiguous().view(3, 4)": m62.contiguous().view(3, 4),
}
for expr, t in results.items():
    shared = t.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    print(f"{expr:31} {'a view of base' if shared else 'a copy'}")
    assert shared == (t._base is base)
print(results["m62.reshape(3, 4)"])
assert [t.untyped_storage().data_ptr() == base.untyped_storage().data_ptr() for t in results.values()] == [
    True,
    False,
    False,
    False,
]
assert torch.equal(results["m62.reshape(2, 3, 2)"], results["m62.contiguous().view(2, 3, 2)"])  # same values
assert torch.equal(results["m62.reshape(3, 4)"], results["m62.contiguous().view(3, 4)"])
assert m26.contiguous() is m26 and m26.contiguous().view(3, 4)._base is base  # contiguous already: no copy
detached = base.detach()
print(
    "base.detach(): shares base's storage:",
    detached.untyped_storage().data_ptr() == base.untyped_storage().data_ptr(),
    "| _base:",
    detached._base,
)
assert detached._base is None and detached.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()

# %% [markdown]
# ## 5. Tensors and NumPy: shared memory (共享内存)
#
# `torch.from_numpy(a)` and `t.numpy()` do not copy: the tensor and the array are two views of the same memory, so
# changing one changes the other. `clone()` makes an independent copy and breaks the link. `torch.tensor(a)`
# always copies; `torch.as_tensor(a)` and `torch.asarray(a)` share when they can (same dtype, same device) and copy
# otherwise. NumPy's `np.shares_memory(a, b)` tells whether two arrays overlap in memory; the cell uses it.

# %%
arr = np.zeros(3)
t = torch.from_numpy(arr)
np.add(arr, 1, out=arr)  # change the array ...
print("array:", arr, " tensor:", t)  # ... and the tensor changed too
assert t.dtype == torch.float64  # NumPy's default float is float64, and from_numpy keeps it

t = torch.zeros(3)
linked, copied = t.numpy(), t.clone().numpy()
t.add_(1)  # the trailing underscore: an in-place method (end of this section)
print("tensor:", t, " .numpy():", linked, " .clone().numpy():", copied)
assert linked[0] == 1.0 and copied[0] == 0.0

conversions = {
    "torch.tensor(arr)": torch.tensor(arr),
    "torch.as_tensor(arr)": torch.as_tensor(arr),
    "torch.asarray(arr)": torch.asarray(arr),
    "torch.as_tensor(arr, dtype=torch.float32)": torch.as_tensor(arr, dtype=torch.float32),
}
for expr, t in conversions.items():
    print(f"{expr:42} shares memory with arr: {np.shares_memory(t.numpy(), arr)}")
assert [np.shares_memory(t.numpy(), arr) for t in conversions.values()] == [False, True, True, False]

# %% [markdown]
# **Getting a NumPy copy of a tensor that takes part in training.** A tensor made with `requires_grad=True` asks
# PyTorch to record every operation on it, so that gradients can be computed later (autograd, which notebook 02
# teaches). `.numpy()` refuses such a tensor. `t.detach()` returns a tensor on the same memory without that
# recording; older code writes `t.data`, which is similar (notebook 02 shows where it differs). Neither is a copy:
# an array made with `t.detach().numpy()` or `t.data.numpy()` changes when the tensor does. To get a snapshot, copy:
# `t.detach().clone().numpy()`, or `np.array(t.detach())`. `t.numpy(force=True)` detaches (and moves to the CPU)
# for you; on a CPU tensor it still shares memory. (`torch.no_grad()` in the cell lets it change `w` in
# place without recording; notebook 02 explains it.)
#
# In the other direction, NumPy arrays can have **negative strides** (`a[::-1]` walks the memory backwards), which
# PyTorch tensors cannot: `torch.from_numpy` refuses them. Copy first, `a[::-1].copy()`, or flip on the PyTorch side
# with `torch.flip` (section 8).

# %%
w = torch.zeros(3, requires_grad=True)
via_data, via_detach, via_clone = w.data.numpy(), w.detach().numpy(), w.detach().clone().numpy()
with torch.no_grad():
    w.add_(5)
print("after w.add_(5):  .data.numpy()", via_data, "| .detach().numpy()", via_detach, "| .clone().numpy()", via_clone)
assert np.shares_memory(w.numpy(force=True), via_detach)
try:
    w.numpy()
except RuntimeError as err:
    print("w.numpy():", err)
assert np.shares_memory(via_data, via_detach) and via_data[0] == 5.0 and via_detach[0] == 5.0 and via_clone[0] == 0.0

a = np.arange(4)
print("a[::-1].strides:", a[::-1].strides, "(bytes; negative)")
try:
    torch.from_numpy(a[::-1])
except ValueError as err:
    print("from_numpy(a[::-1]):", type(err).__name__ + ":", str(err).strip())
assert a[::-1].strides[0] < 0
fixed = torch.from_numpy(a[::-1].copy())
print("from_numpy(a[::-1].copy()):", fixed.tolist(), "| or torch.flip:", torch.flip(torch.from_numpy(a), [0]).tolist())
assert fixed.tolist() == [3, 2, 1, 0]

# %% [markdown]
# Every dtype of section 2's table converts to NumPy and back, `int8` included. The exceptions are the types NumPy
# lacks: `bfloat16`, the 8-bit floats (`float8_e4m3fn`, `float8_e5m2`) and `complex32`. For them `.numpy()` raises;
# convert to `float32` (or `complex64`) first.

# %%
for low in (torch.bfloat16, torch.float8_e4m3fn):
    try:
        torch.tensor([1.5, 2.0]).to(low).numpy()
    except TypeError as err:
        print(f"{str(low):20} .numpy():", type(err).__name__ + ":", err)
bf = torch.tensor([1.5, 2.0], dtype=torch.bfloat16)
print("bf.float().numpy() =", bf.float().numpy())
assert bf.float().numpy().dtype == np.float32

# %% [markdown]
# `item()` turns a one-element tensor into a Python number, `tolist()` a tensor into nested lists. A loss is
# usually a sum or a mean, a 0-d tensor of shape `torch.Size([])` (not `(1,)`): `loss.item()` is the number to
# print or log.

# %%
s = torch.tensor(1.0).item()
lst = torch.tensor([[1, 2], [3, 4]]).tolist()
print(s, type(s).__name__, "|", lst, type(lst).__name__)
loss = (torch.tensor([0.5, 1.5]) ** 2).mean()
print("a loss:", loss, "shape", tuple(loss.shape), "| loss.item() =", loss.item())
assert loss.shape == torch.Size([]) and loss.item() == 1.25
try:
    torch.tensor([1.0, 2.0]).item()
except RuntimeError as err:
    print("item() on 2 elements:", err)

# %% [markdown]
# ### In-place operations (原地操作)
#
# A method ending in `_` (`add_`, `mul_`, `clamp_`, `zero_`) is an **in-place operation** (原地操作): it writes into the
# tensor itself instead of returning a new one; so do `+=`, `*=`, ..., and `out=` does the same for functions.
# Without them, `y = y + x` computes a new tensor in new memory and then rebinds the name `y` to it. In-place
# operations save memory, but autograd sometimes needs the old values; notebook 03 shows the error you then get.
# The cell checks "same memory" with `t.data_ptr()`, the address of the tensor's first element (unlike
# `t.untyped_storage().data_ptr()`, the start of its storage, it includes the offset).

# %%
a = torch.tensor([1.0, 2.0, 3.0])
ptr = a.data_ptr()
a.mul_(10).clamp_(max=25)
b = torch.empty(3)
torch.add(a, 1, out=b)
print(a, b)
assert a.data_ptr() == ptr
y = torch.zeros(3)
before = y.data_ptr()
y += 1  # in place: same memory
same = y.data_ptr() == before
y = y + 1  # a new tensor, then the name y points at it
print("after y += 1, same memory:", same, "| after y = y + 1, same memory:", y.data_ptr() == before)
assert same and y.data_ptr() != before

# %% [markdown]
# ## 6. Images: tensor ↔ PIL ↔ NumPy
#
# Image libraries such as Pillow (PIL) store pixels as `uint8` in (height, width, channels) order; PyTorch models
# expect floats in (channels, height, width) order, scaled to [0, 1]. torchvision's
# `torchvision.transforms.v2.functional` converts between them (notebook 04 uses it for data loading):
# `to_image` + `to_dtype(..., scale=True)` one way, `to_pil_image` the other. (`transforms.functional.to_tensor`,
# common in older code, still works but belongs to the old transforms API.) By hand, `permute(2, 0, 1)` and
# `/ 255` give the same numbers. Mind one trap: `np.asarray(pil_image)` returns a *read-only* array, and
# `torch.from_numpy` on it warns that writing to the tensor would be undefined. `np.array(pil_image)` copies
# into writable memory.

# %%
from PIL import Image
from torchvision.transforms.v2 import functional as TF

rng = np.random.default_rng(0)  # NumPy's seeded random-number generator
hwc = rng.integers(0, 256, size=(4, 6, 3), dtype=np.uint8)  # a tiny 4x6 RGB picture
pil = Image.fromarray(hwc)
chw = TF.to_dtype(TF.to_image(pil), torch.float32, scale=True)  # PIL -> float tensor in [0, 1], (C, H, W)
manual = torch.from_numpy(np.array(pil)).permute(2, 0, 1).float() / 255  # np.array copies: writable memory
back = TF.to_pil_image(chw)  # tensor -> PIL
print("PIL size (W, H):", pil.size, "mode", pil.mode, "| tensor", tuple(chw.shape), chw.dtype)
assert torch.allclose(chw, manual)
assert np.array_equal(np.asarray(back), hwc)  # the round trip is lossless
print("round trip tensor -> PIL -> numpy is exact:", np.array_equal(np.asarray(back), hwc))
torch.set_warn_always(True)  # a once-per-session warning too (section 2)
print("from_numpy(np.asarray(pil)):", end=" ")  # np.asarray: a read-only view of the image's pixels
show_warning(lambda: torch.from_numpy(np.asarray(pil)), UserWarning, "not writable")
torch.set_warn_always(False)

# %% [markdown]
# The manual way back, tensor → PIL, is `Image.fromarray((t * 255).clamp(0, 255).byte().permute(1, 2, 0).numpy())`.
# Each step matters. `clamp` first: a value outside [0, 1] (after a model or an augmentation) would not fit in a
# byte, and converting it does not clamp for you. `.byte()` (`uint8`) then *truncates*, like every float-to-integer
# conversion (section 2): 0.5 × 255 = 127.5 becomes 127, and 0.999 × 255 becomes 254. That is harmless for a
# tensor that came from bytes (each value is an exact byte again) and what `to_pil_image` does too; round first,
# `.round().byte()`, if you want the nearest value.

# %%
t = torch.tensor([0.0, 0.2, 0.5, 0.999, 1.0, 1.2, -0.1]).view(1, 1, 7)  # a 1-channel, 1x7 "image"
truncated = (t * 255).clamp(0, 255).byte()
rounded = (t * 255).clamp(0, 255).round().byte()
print("t * 255:", [round(value, 1) for value in (t * 255).flatten().tolist()])
print("byte()  :", truncated.flatten().tolist())
print("round() :", rounded.flatten().tolist())
pil_gray = Image.fromarray(truncated.permute(1, 2, 0).squeeze(2).numpy())  # (H, W) for a 1-channel image
assert truncated.flatten().tolist() == [0, 51, 127, 254, 255, 255, 0] and rounded.flatten()[2:4].tolist() == [128, 255]
assert np.array_equal(np.asarray(TF.to_pil_image(t.clamp(0, 1))), np.asarray(pil_gray))  # to_pil_image truncates too
print("to_pil_image(t.clamp(0, 1)) gives the byte() row:", np.asarray(TF.to_pil_image(t.clamp(0, 1))).tolist())
every_byte = torch.arange(256, dtype=torch.uint8)
assert torch.equal((every_byte.float() / 255 * 255).byte(), every_byte)  # bytes -> [0, 1] -> bytes is exact
print(
    "all 256 byte values survive / 255, * 255, .byte():",
    torch.equal((every_byte.float() / 255 * 255).byte(), every_byte),
)

# %% [markdown]
# ## 7. Broadcasting (广播) and matrix products (矩阵乘法)
#
# ### Broadcasting
#
# Element-wise operations (`+`, `*`, `torch.mul`) **broadcast**: shapes are aligned from the right, and a dimension
# of size 1 (or a missing one) is stretched to match. "Stretched" costs nothing: the size-1 dimension gets stride 0,
# so the same element is read again and again. `expand` makes such a stride-0 view on purpose; `repeat` makes a
# real copy. Writing into a stride-0 view is a trap: one memory location stands for several elements. Arithmetic
# in-place operations (`add_`, `mul_`, `clamp_`, `copy_`, ...) refuse; `fill_`, `zero_` and indexed assignment
# do not, and silently change every element that shares the location, and the original tensor with them.

# %%
col, row = torch.arange(3).view(3, 1), torch.arange(4)
print("(3,1) + (4,) ->", tuple((col + row).shape))
print(col * 10 + row)
print("broadcast_shapes((2,1,3,4), (5,1,1)) =", tuple(torch.broadcast_shapes((2, 1, 3, 4), (5, 1, 1))))
stretched = torch.broadcast_tensors(col * 10, row)  # what broadcasting does, made visible (as views: stride 0)
print("strides of the stretched operands:", [t.stride() for t in stretched])
assert torch.equal(stretched[0] + stretched[1], col * 10 + row) and stretched[0].stride() == (1, 0)

fig, axes = plt.subplots(1, 3, figsize=(8, 2.4))
panels = (
    ("col * 10: (3, 1) -> (3, 4)", stretched[0]),
    ("row: (4,) -> (3, 4)", stretched[1]),
    ("sum: (3, 4)", stretched[0] + stretched[1]),
)
for ax, (title, grid) in zip(axes, panels):
    grid = grid.contiguous()  # matplotlib wants real memory, not a stride-0 view
    ax.imshow(grid.numpy(), cmap="Blues", vmin=-5, vmax=30)
    for (i, j), value in np.ndenumerate(grid.numpy()):
        ax.text(j, i, str(value), ha="center", va="center", fontsize=10)
    ax.set_title(title, fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])
fig.suptitle("Broadcasting repeats size-1 dimensions (stride 0, no copy) until the shapes match", fontsize=11)
plt.show()

expanded, repeated = col.expand(3, 4), col.repeat(1, 4)
print(
    "col.expand(3, 4): strides",
    expanded.stride(),
    "same storage as col:",
    expanded.untyped_storage().data_ptr() == col.untyped_storage().data_ptr(),
    "| col.repeat(1, 4): strides",
    repeated.stride(),
    "same storage:",
    repeated.untyped_storage().data_ptr() == col.untyped_storage().data_ptr(),
)
assert torch.equal(expanded, repeated) and expanded.stride() == (1, 0)
try:
    expanded.add_(1)
except RuntimeError as err:
    print("expanded.add_(1):", str(err).split(". ")[0])
expanded[0, 0] = 9  # accepted: writes col[0], which is the whole first row of expanded
print("after expanded[0, 0] = 9: col =", col.flatten().tolist(), "| expanded[0] =", expanded[0].tolist())
assert col[0, 0] == 9 and expanded[0].tolist() == [9, 9, 9, 9]

# %% [markdown]
# ### Matrix products
#
# In **matrix multiplication** (矩阵乘法), the last dimension of the first operand is contracted with the
# second-to-last of the second:
#
# | function | shapes | broadcasts? |
# |---|---|---|
# | `torch.mm(a, b)` | (m, n) @ (n, p) → (m, p) | no, 2-D only |
# | `torch.bmm(a, b)` | (b, m, n) @ (b, n, p) → (b, m, p) | no, 3-D only, same batch |
# | `torch.matmul(a, b)`, `a @ b` | (..., m, n) @ (..., n, p) → (..., m, p) | yes, over the leading dims |
# | `a * b`, `torch.mul` | element-wise | yes |
#
# With `matmul`, the **batch dimensions** (批维度, all but the last two) broadcast like any element-wise shape:
# `(2, 1, 3, 4) @ (5, 4, 2)` treats the first as 2 × 1 matrices of 3 × 4 and the second as 5 matrices of 4 × 2,
# broadcasts the batches `(2, 1)` and `(5,)` to `(2, 5)`, and returns `(2, 5, 3, 2)`.

# %%
a, b = torch.ones(2, 3), torch.ones(3, 4)
print("mm :", tuple(torch.mm(a, b).shape))
print("bmm:", tuple(torch.bmm(torch.ones(8, 2, 3), torch.ones(8, 3, 4)).shape))
a, b = torch.ones(2, 1, 3, 4), torch.ones(5, 4, 2)
c = torch.matmul(a, b)
print("matmul (2,1,3,4) @ (5,4,2) ->", tuple(c.shape))
assert c.shape == (2, 5, 3, 2) and torch.all(c == 4)  # every entry sums 4 products of ones
try:
    torch.mm(torch.ones(2, 1, 3, 4), torch.ones(5, 4, 2))
except RuntimeError as err:
    print("mm refuses >2-D:", err)

# %% [markdown]
# `matmul` with batch dimensions is the same as looping over the batch with `mm`. "The same" up to rounding: the
# batched kernel may add the four products of each entry in another order than `mm` does, and float32 addition is
# not associative, so the last bits can differ (how, depends on the CPU). Compare floats with
# `torch.testing.assert_close`, whose tolerances suit the dtype (for float32: relative 1.3e-6, absolute 1e-5);
# `torch.equal` or `allclose` with its default absolute tolerance of 1e-8 can fail on a value near zero.

# %%
a, b = torch.randn(2, 1, 3, 4), torch.randn(5, 4, 2)
looped = torch.stack([torch.stack([a[i, 0] @ b[j] for j in range(5)]) for i in range(2)])
torch.testing.assert_close(a @ b, looped)
print("a @ b equals the loop of mm up to float32 rounding:", tuple((a @ b).shape))

# %% [markdown]
# ### Vectors in `matmul`
#
# "`matmul` multiplies the last two dimensions" holds when both operands have at least two. A **1-D operand** is
# treated as a matrix for the product and its extra dimension is removed afterwards:
#
# - vector @ vector: the dot product, a 0-d tensor (`torch.dot`);
# - matrix @ vector: the vector is read as a column `(n, 1)`, the result's last dimension is dropped: `(m, n) @ (n,)`
#   gives `(m,)` (`torch.mv`);
# - vector @ matrix: the vector is read as a row `(1, n)` (a 1 is *prepended*), and that 1 is dropped again:
#   `(n,) @ (n, p)` gives `(p,)`;
# - with batch dimensions the same holds: `(n,) @ (b, n, p)` gives `(b, p)`.
#
# Two consequences. Keep a column 2-D (`v[:, None]`) if you want a `(m, 1)` result. And a shape mismatch with a
# vector reports the prepended 1, as in the error below (`1x3`).

# %%
v = torch.tensor([1.0, 2.0, 3.0])
M = torch.arange(6.0).view(2, 3)
products = {
    "v @ v": v @ v,
    "M @ v": M @ v,
    "v @ M.T": v @ M.T,
    "M @ v[:, None]": M @ v[:, None],
    "v @ ones(4, 3, 2)": v @ torch.ones(4, 3, 2),
}
for expr, t in products.items():
    print(f"{expr:17} shape {str(tuple(t.shape)):8} {t.tolist() if t.numel() <= 2 else '...'}")
assert products["v @ v"].shape == () and products["v @ v"].item() == 14.0 and torch.equal(v @ v, torch.dot(v, v))
assert products["M @ v"].tolist() == [8.0, 26.0] and torch.equal(M @ v, torch.mv(M, v))
assert products["M @ v[:, None]"].shape == (2, 1) and products["v @ ones(4, 3, 2)"].shape == (4, 2)
try:
    v @ M  # (3,) @ (2, 3): the vector becomes (1, 3)
except RuntimeError as err:
    print("v @ M:", err)

# %% [markdown]
# ### `einsum`: products by index names
#
# `torch.einsum` writes a product as index letters, one per dimension: letters that appear in the inputs but not
# after `->` are summed over, the others are kept in the order given. `"ij,j->i"` is `M @ v`, `"i,i->"` a dot
# product, `"i,j->ij"` an outer product, `"bij,bjk->bik"` `bmm`; `...` stands for any number of leading
# dimensions. It is often the clearest way to say which dimensions are contracted, and the solutions of later
# lessons' exercises use it.

# %%
batch_a, batch_b = torch.ones(8, 2, 3), torch.ones(8, 3, 4)
assert torch.equal(torch.einsum("ij,j->i", M, v), M @ v)
assert torch.equal(torch.einsum("i,i->", v, v), v @ v)
assert torch.equal(torch.einsum("i,j->ij", v, v), v[:, None] * v[None, :])
assert torch.equal(torch.einsum("bij,bjk->bik", batch_a, batch_b), torch.bmm(batch_a, batch_b))
assert torch.equal(torch.einsum("...ij,...j->...i", torch.ones(5, 2, 3), v), torch.ones(5, 2, 3) @ v)
print("einsum 'ij,j->i':", torch.einsum("ij,j->i", M, v).tolist(), "| 'i,i->':", torch.einsum("i,i->", v, v).item())
print(
    "einsum 'i,j->ij': shape",
    tuple(torch.einsum("i,j->ij", v, v).shape),
    "| 'bij,bjk->bik': shape",
    tuple(torch.einsum("bij,bjk->bik", batch_a, batch_b).shape),
)

# %% [markdown]
# ## 8. Flipping, normalising and comparing
#
# Slicing works as in NumPy, except that **negative steps are not allowed** (`t[::-1]` raises): strides are never
# negative in PyTorch. `torch.flip(t, dims)` reverses the given dimensions (a copy). Older code reverses a dimension
# by indexing with a reversed `arange`, which gives the same result less readably.

# %%
img = torch.arange(2 * 3 * 4).view(1, 2, 3, 4).float()  # N, C, H, W
try:
    img[..., ::-1]
except ValueError as err:
    print("t[..., ::-1]:", type(err).__name__, "-", err)
by_index = img[:, :, :, torch.arange(img.size(3) - 1, -1, -1)]
flipped = torch.flip(img, dims=[3])  # horizontal flip
assert torch.equal(by_index, flipped)
print(flipped[0, 0])

# %% [markdown]
# `torch.nn.functional.normalize(x, p=2, dim=1)` divides each row by its length (its L2 norm along `dim`, floored
# at `eps` so that a zero row does not divide by zero): `[[6, 8]]` becomes `[[0.6, 0.8]]`. It is a reduction with
# `keepdim=True` followed by a broadcast division. Like every norm it needs a floating-point tensor: on the
# integer tensor `torch.tensor([[6, 8]])` it raises.

# %%
v = torch.tensor([[6.0, 8.0], [0.0, 0.0]])
unit = F.normalize(v, p=2.0, dim=1)
print("F.normalize:", [[round(value, 4) for value in r] for r in unit.tolist()])
assert torch.equal(unit[:1], v[:1] / v[:1].norm(dim=1, keepdim=True)) and unit[1].tolist() == [0.0, 0.0]
try:
    F.normalize(torch.tensor([[6, 8]]))
except RuntimeError as err:
    print("on int64:", type(err).__name__ + ":", err)

# %% [markdown]
# `torch.equal` asks "same shape and exactly the same values" — right for integers. For floats, rounding makes exact
# equality fragile: `torch.allclose` (and `torch.testing.assert_close`, which also explains a mismatch) compare with
# a tolerance.

# %%
x = torch.tensor([0.1, 0.2], dtype=torch.float64).sum()
y = torch.tensor(0.3, dtype=torch.float64)
print(f"0.1 + 0.2 = {x.item()!r}, 0.3 = {y.item()!r}, difference {abs(x - y).item():.1e}")
print("equal:", torch.equal(x, y), "| allclose:", torch.allclose(x, y))
print("integers compare exactly:", torch.equal(torch.arange(3), torch.tensor([0, 1, 2])))
assert not torch.equal(x, y) and torch.allclose(x, y)
torch.testing.assert_close(x, y)  # passes silently; on a real mismatch it names the worst element

# %% [markdown]
# ## 9. `clone` versus `detach`
#
# Both make a new tensor object; they differ in memory and in autograd. A few words of autograd (notebook 02) are
# enough here: operations on a tensor with `requires_grad=True` are recorded, each result remembers the operation
# that made it in `grad_fn`, and `loss.backward()` follows those records back to compute gradients into `.grad`.
#
# | | new memory? | stays in the autograd graph? |
# |---|---|---|
# | `t.clone()` | yes | yes (gradients flow back through it) |
# | `t.detach()` | no, shares memory | no |
# | `t.detach().clone()` | yes | no — an independent snapshot |

# %%
w = torch.tensor([1.0, 2.0], requires_grad=True)
c, d, snap = w.clone(), w.detach(), w.detach().clone()
print("clone :", c.requires_grad, c.grad_fn.__class__.__name__, "shares memory:", c.data_ptr() == w.data_ptr())
print("detach:", d.requires_grad, d.grad_fn, "shares memory:", d.data_ptr() == w.data_ptr())
(c * 3).sum().backward()
print("gradient through clone:", w.grad)
with torch.no_grad():
    w.add_(10)
print("after changing w: detach sees", d, "| snapshot keeps", snap)
assert torch.equal(d, w.detach()) and torch.equal(snap, torch.tensor([1.0, 2.0]))

# %% [markdown]
# ## 10. Naming dimensions with einops
#
# Code that indexes dimensions by number (`dim=1`, `permute(0, 2, 3, 1)`) is hard to read and easy to get wrong.
# PyTorch once had a prototype for names, *named tensors* (`torch.randn(32, 3, 56, 56, names=("N", "C", "H", "W"))`,
# `images.sum("C")`, `align_to`); it is gone from PyTorch 2.14, and `names=` is refused.

# %%
try:
    torch.randn(32, 3, 56, 56, names=("N", "C", "H", "W"))
except TypeError as err:
    print("names= ->", type(err).__name__, "-", str(err).splitlines()[0])
assert not hasattr(torch.Tensor, "align_to")

# %% [markdown]
# The library [einops](https://einops.rocks) is the better tool: the names live in a pattern string, every
# operation checks the shapes it is given, and it works on any tensor. A pattern names the input's dimensions
# left of `->` and the output's right of it, separated by spaces. `rearrange` reorders, merges and splits
# dimensions; `reduce` sums, averages or takes the maximum over the names that disappear; `repeat` tiles along a
# new name. Parentheses group: on the right, `(h w)` merges two dimensions into one (h outer, w inner, as
# `flatten` would); on the left, `(h p1)` splits one dimension into two, with the size of one given as an argument
# (`p1=14`).
#
# The cell uses all three. The "patches" line cuts each 56 × 56 image into 16 tiles of 14 × 14 pixels and turns
# each tile into one vector, the input format of a vision transformer (ViT). The "max pool" line takes the maximum
# of each 2 × 2 block, which is what `F.max_pool2d(images, 2)` computes (notebook 04 teaches pooling layers).

# %%
from einops import rearrange, reduce, repeat

images = torch.randn(32, 3, 56, 56)
per_channel_sum = reduce(images, "n c h w -> n h w", "sum")  # sum over the channels, like images.sum(dim=1)
assert torch.allclose(per_channel_sum, images.sum(dim=1))
nhwc = rearrange(images, "n c h w -> n h w c")  # channels last, like images.permute(0, 2, 3, 1)
patches = rearrange(images, "n c (h p1) (w p2) -> n (h w) (p1 p2 c)", p1=14, p2=14)  # 16 patches per image
pooled = reduce(images, "n c (h 2) (w 2) -> n c h w", "max")  # 2x2 max pooling
tiled = repeat(torch.arange(3), "c -> n c", n=2)
for name, t in [("sum over c", per_channel_sum), ("channels last", nhwc), ("patches", patches), ("max pool", pooled)]:
    print(f"{name:14} {tuple(t.shape)}")
print(tiled)
assert torch.equal(nhwc, images.permute(0, 2, 3, 1)) and patches.shape == (32, 16, 14 * 14 * 3)
assert torch.equal(pooled, F.max_pool2d(images, 2))
try:
    rearrange(images, "n c h w -> n (c h w) x")
except Exception as err:  # einops.EinopsError
    print(type(err).__name__, "-", str(err).splitlines()[-1])

# %% [markdown]
# ## 11. Devices (设备)
#
# A tensor lives on one **device** (设备); operations need their operands on the same device. The course's
# `utils.get_device()` picks CUDA, then Apple's MPS, then the CPU (set `TORCH_COURSE_DEVICE=cpu` to force the CPU).
# `.to(device)` copies a tensor there (and returns the tensor itself if it is already there); results come back
# with `.cpu()` before `.numpy()`. The stored outputs of this notebook were made on the CPU; on a GPU machine the
# same cells run on `cuda`.
#
# PyTorch also has a device-neutral module, `torch.accelerator` (since PyTorch 2.6): `is_available()` says whether
# an accelerator (CUDA, MPS, XPU, ...) can be used, and `device_count()` how many there are.
# `current_accelerator(check_available=True)` (the argument exists since 2.7) returns which one, or `None` when
# none can be used. Without `check_available` it names the accelerator this *build* of PyTorch was made for, even
# on a machine without one (a CUDA wheel says `cuda`), so code that picks a device should pass
# `check_available=True`. That replaces the common one-liner `torch.device("cuda" if torch.cuda.is_available()
# else "cpu")`, which never finds MPS or XPU. The cell prints the CPU facts on a machine without an accelerator,
# and the accelerator's on a machine with one.

# %%
from utils import get_device

device = get_device()
x = torch.arange(4.0)
y = x.to(device)
z = (y * 2).cpu().numpy()
print("computed on", device.type, "->", z)
assert x.to("cpu") is x  # no copy when it is already there
if device.type != "cpu":
    try:
        x + y
    except RuntimeError as err:
        print("mixing devices:", str(err).split(".")[0])
else:
    print("On a GPU, x + y would fail here: 'Expected all tensors to be on the same device'")

accelerator = torch.accelerator.current_accelerator(check_available=True)  # None: no accelerator can be used
if accelerator is None:
    print(
        "no accelerator: is_available() =",
        torch.accelerator.is_available(),
        "| device_count() =",
        torch.accelerator.device_count(),
        "| current_accelerator(check_available=True) = None",
    )
else:
    print("accelerator:", accelerator.type, "| devices:", torch.accelerator.device_count())
assert (accelerator is None) == (not torch.accelerator.is_available()) == (torch.accelerator.device_count() == 0)
assert accelerator is None or accelerator == torch.accelerator.current_accelerator()  # the build's kind
if torch.cuda.is_available() or torch.backends.mps.is_available():
    assert torch.accelerator.is_available()
pick = accelerator or torch.device("cpu")  # a device-neutral choice, without utils
print("torch.zeros(2, device=pick).device.type:", torch.zeros(2, device=pick).device.type)
assert torch.zeros(2, device=pick).device.type == pick.type

# %% [markdown]
# ## Exercises (练习)
#
# Three exercises, easiest first: predict, write a function, then a stretch that combines several sections. Each has a
# **stub cell** that starts with `# ✏️ Exercise N`: edit it and run it. The **check cell** below it then says
# *correct*, or *not yet* with a hint and the section to re-read, or *not attempted yet* while the stub is untouched.
# This section does not depend on the lesson's cells: after a kernel restart, run its first cell and go on.
# `make progress` (without make, e.g. on Windows: `python tools/course.py progress`) lists which exercises of every
# notebook pass.

# %%
import torch

from utils.exercises import Checker

ex = Checker("01")

# %% [markdown]
# ### Exercise 1 · Predict shapes and strides
#
# For `x = torch.arange(24).reshape(2, 3, 4)`, predict — on paper first — the shape of `a = x.sum(dim=1)`, the
# shape of `b = x.sum(dim=1, keepdim=True)` and the strides of `c = x.transpose(0, 2)`. Write them as a list of
# three tuples, then check. (Running the code afterwards to see why is allowed; running it instead of thinking
# is allowed too, but teaches less.)

# %%
# ✏️ Exercise 1: replace ... with [shape of a, shape of b, strides of c], e.g. [(1, 2), (3, 4), (5, 6, 7)]
answer_1 = ...

# %%
ex.check(1, answer_1)

# %% [markdown]
# ### Exercise 2 · Channels-last, flattened
#
# Vision transformers read an image batch of shape `(N, C, H, W)` as a sequence of pixels: shape `(N, H*W, C)`,
# where `out[n, h * W + w, c]` is `images[n, c, h, w]`. Write `channels_last_flat(images)` in one or two lines,
# for any sizes, without a Python loop (section 4: moving a dimension changes only the strides).


# %%
# ✏️ Exercise 2: write the body of the function
def channels_last_flat(images: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError("your code here")


# %%
ex.check(2, channels_last_flat)

# %% [markdown]
# ### Exercise 3 · Nearest neighbours without a loop (stretch)
#
# Given points `a` of shape `(n, d)` and `b` of shape `(m, d)`, return `(dist2, idx)`: `dist2[i, j]` is the
# squared Euclidean distance between `a[i]` and `b[j]` (shape `(n, m)`), and `idx[i]` is the index of the point
# of `b` nearest to `a[i]` (shape `(n,)`). No Python loop, and no `torch.cdist` (it would do the work for you):
# broadcast `a` and `b` against each other with `None` (section 3's indexing), then reduce. This is the core of
# k-nearest-neighbour classifiers and k-means.


# %%
# ✏️ Exercise 3: write the body of the function
def nearest(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    raise NotImplementedError("your code here")


# %%
ex.check(3, nearest)

# %% [markdown]
# ## Summary
#
# - Create tensors with `torch.tensor(data)` or by shape (`zeros/ones/full/arange/linspace/eye/rand/randn`,
#   `empty` to allocate only), with `dtype=` and `device=`, or `*_like` another tensor. Not with the legacy
#   `torch.IntTensor(n)`, which allocates garbage. Python ints become `int64`, floats `float32` (NumPy: `float64`);
#   `float32` is also much faster than `float64`.
# - Type promotion: the highest category wins (bool < integer < float < complex); dimensioned tensors decide the
#   size; Python numbers and 0-d tensors count only if they raise the category. So `uint8 + 100` stays `uint8` and
#   wraps (`200 + 100 = 44`): convert images with `.float()` before arithmetic. `torch.result_type` tells you the
#   dtype; in-place operations never change it.
# - Reductions (归约) take `dim` (removed) and `keepdim=True` (kept with size 1, ready to broadcast); `cat` joins
#   along an existing dimension, `stack` along a new one; `unsqueeze/squeeze/permute/flatten` reshape the
#   dimensions.
# - Basic indexing (integers, slices, `None`, `...`, and 0-d integer tensors) gives views; advanced indexing
#   (index lists, masks) gives copies, but assignment through it (`x[mask] = 0`) writes in place; with repeated
#   indices, `+=` adds once (accumulate with `index_add_` or `index_put_(..., accumulate=True)`).
# - A tensor is storage (存储) + offset + shape + strides (步长). A transpose swaps sizes and strides and moves
#   nothing. `view` works whenever the requested shape can be expressed with the existing strides, contiguous or
#   not; `reshape` always works and copies only when it must; `.contiguous().view()` gives the same values but
#   copies every non-contiguous tensor. Tell views from copies by their storage, not by the private `_base`.
# - `from_numpy`/`.numpy()`/`as_tensor` share memory, and so do `.detach().numpy()` and `.data.numpy()`;
#   `clone()` and `torch.tensor` copy; `from_numpy` refuses NumPy's negative strides (copy first) and `.numpy()`
#   refuses `bfloat16` and the other types NumPy lacks (convert first). A loss is a 0-d tensor: read it with
#   `item()`.
# - Images: `uint8` (H, W, C) ↔ float (C, H, W) in [0, 1]; clamp before `.byte()`, which truncates.
# - Broadcasting (广播) aligns shapes from the right and stretches size-1 dimensions with stride 0 (`expand`),
#   without copying (`repeat` copies); `mm` is 2-D, `bmm` batched 3-D, `matmul`/`@` broadcasts the batch
#   dimensions, and treats a 1-D operand as a row or a column whose extra dimension is removed again; `einsum`
#   names the indices.
# - No negative-step slicing: use `torch.flip`. `F.normalize` divides by the norm along `dim` (floats only).
#   Compare floats with `allclose`/`assert_close`.
# - `clone()` copies and stays in the autograd graph; `detach()` shares memory and leaves it.
# - Named tensors are gone: name dimensions with einops patterns.
# - Move data with `.to(device)`; pick the device once, with `get_device()` or
#   `torch.accelerator.current_accelerator(check_available=True)`.
#
# **Where to look things up.** PyTorch's [documentation](https://docs.pytorch.org/docs/stable/index.html) has the
# API reference (`torch`, `torch.Tensor`, `torch.nn`, ...: every function with its arguments) and, under "Notes",
# explanations of mechanisms such as broadcasting and autograd; the
# [tutorials](https://docs.pytorch.org/tutorials/) are worked examples. This course links the page that goes with a
# topic where it helps.
#
# Next: **02 · autograd** — how PyTorch computes gradients.

# %% [markdown]
# ## For readers of the original notes (原笔记勘误)
#
# This course was built from a teacher's study notes written for PyTorch 1.x. Where those notes say something that
# does not hold in PyTorch 2.14, or use a recipe that has a better replacement today, this lesson teaches today's
# version; the table maps each one.
#
# | What the notes say | What holds in PyTorch 2.14 | Where this lesson shows it |
# |---|---|---|
# | `torch.IntTensor(1)` prints `tensor([5], dtype=torch.int32)`, as if it stored a value | With an integer argument a legacy constructor allocates uninitialised memory of that size; the 5 was garbage. Use `torch.tensor(data)` or `zeros/empty(size)` | §2 · Data types |
# | `tensor.type()` gives the data type | It returns the legacy class name as a string (`'torch.FloatTensor'`); `tensor.dtype` is the data type | §2 · Data types |
# | `torch.set_default_tensor_type(torch.FloatTensor)` ("FloatTensor is much faster than DoubleTensor") | Deprecated since 2.1 (it warns): `torch.set_default_dtype` / `torch.set_default_device`; `float32` is already the default. The speed claim holds, measured | §2 · Data types |
# | `scalar.shape` printed as `torch.Size([4])` | A 0-d tensor's shape is `torch.Size([])` | §3 · Dimensions and shapes |
# | `x[[0, 2], None]` is the same as `x[[0, 2]].view(-1, 1)` | Only for a 1-D `x`; in general it is `x[[0, 2]].unsqueeze(1)` | §3 · Dimensions and shapes |
# | A transpose "twists the storage", so `view` fails afterwards | A transpose swaps sizes and strides and moves nothing; `view` fails only when no strides can express the requested shape, and works on many non-contiguous tensors | §4 · Memory layout |
# | `reshape` is equivalent to `.contiguous().view()` | Same values, but `reshape` returns a view whenever one exists, while `.contiguous().view()` copies every non-contiguous tensor | §4 · Memory layout |
# | `tensor.data.numpy()` as an alternative to `tensor.clone().numpy()` | `.data` shares memory, so the array changes with the tensor; today's spelling of that is `.detach().numpy()`, and a copy is `.detach().clone().numpy()` | §5 · Tensors and NumPy |
# | Every CPU tensor except `CharTensor` converts to NumPy and back | `int8` (`CharTensor`) converts; the exceptions today are the types NumPy lacks: `bfloat16`, the `float8` types, `complex32` | §5 · Tensors and NumPy |
# | The loss has shape `(1,)`, so use `loss.item()` | A sum or mean is 0-d, shape `torch.Size([])`; `item()` works on any one-element tensor | §5 · Tensors and NumPy |
# | `torch.from_numpy(np.asarray(PIL.Image.open(path)))` | `np.asarray` of a PIL image is read-only and `from_numpy` warns; `np.array` copies into writable memory | §6 · Images |
# | `torchvision.transforms.functional.to_tensor` | The old transforms API: `v2.functional.to_image` + `to_dtype(..., scale=True)` | §6 · Images |
# | `fromarray(torch.clamp(tensor*255, 0, 255).byte()...)` for tensor → PIL | Right, and the clamp is needed; `.byte()` truncates (0.5 → 127), so round first for the nearest value | §6 · Images |
# | `matmul` "always multiplies the last two dimensions and broadcasts the rest" | True when both operands have two or more dimensions; a 1-D operand gets a 1 prepended or appended, removed again after the product | §7 · Broadcasting and matrix products |
# | Reverse a dimension with `tensor[:, :, :, torch.arange(n - 1, -1, -1)]` | Works; `torch.flip(tensor, dims=[3])` says it directly | §8 · Flipping, normalising and comparing |
# | `normalize(torch.tensor([[6, 8]]))` gives `[[0.6, 0.8]]` | On an integer tensor it raises; normalise floats | §8 · Flipping, normalising and comparing |
# | `tensor.detach.clone()()` | A typo for `tensor.detach().clone()` | §9 · `clone` versus `detach` |
# | Named tensors: `names=('N', 'C', 'H', 'W')`, `images.sum('C')`, `align_to` | Removed: `names=` raises `TypeError`; use einops patterns | §10 · Naming dimensions with einops |
# | `torch.device('cuda' if torch.cuda.is_available() else 'cpu')` | Works for CUDA only; `torch.accelerator.current_accelerator(check_available=True)` also finds MPS and XPU | §11 · Devices |
