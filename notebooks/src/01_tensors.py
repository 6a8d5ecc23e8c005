# %% [markdown]
# # 01 · Tensors (张量)
#
# A **tensor** (张量) is PyTorch's n-dimensional array: the numbers a model reads, computes with and learns. This notebook
# first teaches the everyday operations a NumPy user looks for, then the places where tensors behave differently from
# what one expects.
#
# **You will learn to:**
# - create tensors from data or by shape (`zeros`, `arange`, `rand`, `*_like`, ...) with the `dtype` and
#   `device` you want, and know which dtype PyTorch infers;
# - reduce (`sum(dim=..., keepdim=...)`), join (`cat`, `stack`), reorder (`permute`, `unsqueeze`) and index
#   tensors, and tell when an index gives a view and when a copy;
# - read how a shape is laid over memory (storage and strides) and predict when `view` works, when `reshape`
#   copies, and why `.contiguous().view()` is not the same as `reshape`;
# - share memory with NumPy and images knowingly (which conversions copy and which do not);
# - broadcast, multiply matrices, compare floats, name dimensions with einops, and move tensors to an
#   accelerator (`torch.accelerator`);
# - practise all of it in three self-checking exercises at the end.
#
# **You should know:** Python and a little NumPy. **Study time:** about 60 min. Its cells run in seconds.
# **On a GPU:** the last section moves tensors to `cuda`; everything else is the same.
#
# The course follows a teacher's study notes written for PyTorch 1.x. Where the notes use APIs that are gone
# or misleading today (legacy constructors such as `torch.IntTensor`, named tensors, `torch.set_default_tensor_type`)
# or explain a mechanism wrongly (why `view` fails after a transpose), this notebook says so and shows why.
# %%
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F

from utils import get_device, seed_everything

seed_everything(0)
print("torch", torch.__version__.split("+")[0])

# %% [markdown]
# ## 1. Creating tensors (创建张量)
#
# `torch.tensor(data)` copies Python lists (or a NumPy array) into a new tensor. Most tensors, though, are made by
# shape: `zeros`, `ones`, `full` (one value everywhere), `arange` (a range, end excluded, like `range()`),
# `linspace` (a number of evenly spaced points, both ends included), `eye` (the identity matrix), `rand` (uniform
# in [0, 1)) and `randn` (standard normal). Every creation function takes `dtype=` and `device=` (create a tensor
# where it will be used rather than moving it later), and each has a `*_like` twin that copies shape, dtype and
# device from another tensor. `empty` only allocates: its values are whatever was in memory, so write before you
# read.

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
# indices; `bool` is the type of masks. `float16` and `bfloat16` are the half-precision types of mixed-precision
# training (notebook 07).

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
    print(f"{str(t_dtype):15} <-> numpy.{np.dtype(np_dtype).name:8} {t_dtype.itemsize} byte(s)")
print("aliases:", torch.float is torch.float32, torch.double is torch.float64, torch.long is torch.int64)

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
# **A trap in the notes.** The notes also build tensors with the legacy constructors `torch.IntTensor(1)` and
# `torch.Tensor(...)` and print `tensor([5], dtype=torch.int32)`. That `5` is garbage: with an integer argument the
# legacy constructor allocates *uninitialised memory* of that size; it does not store the number 1. Use
# `torch.tensor(data)` to store data, and `torch.empty/zeros/ones(size)` to allocate.

# %%
legacy = torch.IntTensor(1)  # a tensor of shape (1,) with whatever was in memory
modern = torch.tensor([1], dtype=torch.int32)
print("torch.IntTensor(1).shape =", tuple(legacy.shape), "  (its value is undefined)")
print("torch.tensor([1], dtype=torch.int32) =", modern)
assert legacy.shape == modern.shape == (1,) and modern.item() == 1

# %% [markdown]
# Converting between dtypes: `.float()`, `.long()`, ... or `.to(dtype)` (the general form, which also moves
# devices), `.type(dtype)`, and `.type_as(other)` (take the dtype of another tensor). Converting a float to an
# integer type **truncates toward zero**.

# %%
i = torch.tensor(1)
x = i.float()
print(x, x.dtype, "|", i.type(torch.float16).dtype, "|", i.to(torch.float64).dtype, "|", i.type_as(x).dtype)
print(torch.tensor([-1.7, 1.7]).long())

# %% [markdown]
# The notes set a global default with `torch.set_default_tensor_type(torch.FloatTensor)`. That function has been
# deprecated since PyTorch 2.1: use `torch.set_default_dtype(torch.float32)` (and `torch.set_default_device` for
# the device). The default is already `float32`.

# %%
print("default dtype:", torch.get_default_dtype())
assert torch.get_default_dtype() == torch.float32

# %% [markdown]
# ## 3. Dimensions and shapes (维度与尺寸)
#
# The number of dimensions is the number of nested brackets: a scalar is 0-D, a vector 1-D, a matrix 2-D, a colour
# image 3-D (channels, height, width), a batch of images or a video 4-D (frames, channels, height, width).
# `t.dim()` counts dimensions; `t.shape` (an attribute) and `t.size()` (a method) give the same `torch.Size`.

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

# %% [markdown]
# ### Reductions, joining and reordering dimensions
#
# A **reduction (归约)** (`sum`, `mean`, `max`, `argmax`, ...) over `dim=d` removes dimension `d`; `keepdim=True` keeps it
# with size 1, so that the result still combines with the input by **broadcasting** (广播, section 7), e.g. to subtract
# each row's mean. `cat` joins tensors along an existing dimension, `stack` along a new one. `unsqueeze(d)` adds a
# dimension of size 1, `squeeze(d)` removes one, `permute` reorders all of them.

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
assert m.sum(dim=0).tolist() == [3.0, 5.0, 7.0] and m.sum(dim=1).tolist() == [3.0, 12.0]
assert torch.stack([m, m]).shape == (2, 2, 3) and torch.cat([m, m], dim=1).shape == (2, 6)

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
# returns a **view (视图)**: a new tensor on the *same memory* as the original, so writing into it writes into the
# original (section 4 shows how a view describes its elements without copying them). An index with a list or tensor
# of indices, or a mask, is **advanced indexing** (高级索引): it picks arbitrary elements and returns a **copy (副本)**.
# Assigning *through* advanced indexing, `x[mask] = 0`, does write into `x`: that is an in-place `index_put_`, not a
# read followed by a write.

# %%
x = torch.arange(12.0).view(3, 4)


def kind(t):  # does t use the same memory block (storage, section 4) as x?
    return "view" if t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() else "copy"


indexed = {
    "x[1]": x[1],
    "x[:, 1:3]": x[:, 1:3],
    "x[None, ..., 0]": x[None, ..., 0],
    "x[[0, 2]]": x[[0, 2]],
    "x[x > 6]": x[x > 6],
    "x[[0, 2], None]": x[[0, 2], None],
}
for expr, t in indexed.items():
    print(f"{expr:16} shape {str(tuple(t.shape)):10} {kind(t)}")
assert [kind(t) for t in indexed.values()] == ["view"] * 3 + ["copy"] * 3
row, picked = x[1], x[[0, 2]]
row[0] = -1.0  # writes into x
picked[0, 0] = -2.0  # does not
x[x > 6] = 0.0  # assignment through a mask writes into x
print("x after the writes:", x.tolist())
assert x[1, 0] == -1.0 and x[0, 0] == 0.0 and picked[0, 0] == -2.0 and (x <= 6).all()

# %% [markdown]
# The notes' `x[[0, 2], None]` mixes both: rows 0 and 2 (a copy), then a new dimension of size 1. The notes call it
# the same as `x[[0, 2]].view(-1, 1)`, which holds for their 1-D `x = torch.tensor([1, 2, 3])`; for any `x` it is
# `x[[0, 2]].unsqueeze(1)`.

# %%
x1 = torch.tensor([1, 2, 3])  # the notes' 1-D example
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
# A tensor is a flat block of memory, its **storage (存储)**, plus an **offset** (偏移量), a shape and, for each dimension, a
# **stride** (步长): how many elements to skip in the storage to move one step along that dimension. Element `[i, j]` of a
# matrix lives at `offset + i * stride[0] + j * stride[1]`. A view (视图) is a tensor on another's storage with its own
# offset, shape and strides; `view(shape)` makes one without copying (`-1` lets PyTorch infer one dimension). Basic
# indexing is a view for the same reason: `m34[1]` is offset 4 with stride `(1,)`, the column `m34[:, 1]` offset 1 with
# stride `(4,)`.

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
# The notes say that a transpose "twists the storage", so that `view` fails afterwards, and that `reshape` is equivalent
# to `.contiguous().view()`. Both need correcting. A transpose `t()` moves nothing: it swaps the sizes *and* the
# strides. `m62 = m26.t()` has strides `(1, 6)`, so reading it row by row jumps around the storage: it is no longer a
# **contiguous tensor** (连续张量). The figure shows both tensors over the one storage; each cell's colour is its position
# in the storage.

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
assert all(m62[i, j] == base[i * 1 + j * 6] for i in range(6) for j in range(2))  # the rule the figure draws

fig, axes = plt.subplots(1, 3, figsize=(9, 3.2), gridspec_kw={"width_ratios": [12, 6, 2.4]}, layout="constrained")
panels = (
    ("storage (12 elements)", base.view(1, 12)),
    ("m26 = view(2, 6)\nstrides (6, 1)", m26),
    ("m62 = m26.t()\nstrides (1, 6)", m62),
)
for ax, (title, grid) in zip(axes, panels):
    ax.imshow(grid.numpy(), cmap="viridis", vmin=-4, vmax=15)  # colour = position in the storage
    for (i, j), value in np.ndenumerate(grid.numpy()):
        ax.text(j, i, str(value), ha="center", va="center", color="white", fontsize=9)
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
fig.suptitle("A transpose re-reads the same storage: down m62 steps 1 element, across it steps 6", fontsize=10)
plt.show()

# %% [markdown]
# **`view` does not need a contiguous tensor.** It needs the *requested shape* to be expressible with strides over
# the existing layout. `m62.view(2, 3, 2)` splits the first dimension (6 elements, 1 apart) into 2 × 3 with strides
# `(3, 1)` and keeps the second (stride 6): a view, no copy. `m62.view(3, 4)` is impossible: a row of the result
# would hold the elements `0, 6, 1, 7`, which are +6, -5, +6 apart in the storage, and no single stride does that.
# Only then does `view` raise.

# %%
v232 = m62.view(2, 3, 2)  # works on the non-contiguous tensor
print(
    "m62.view(2, 3, 2): strides",
    v232.stride(),
    "| contiguous:",
    v232.is_contiguous(),
    "| on base's storage:",
    v232._base is base,
)
assert v232.stride() == (3, 1, 6) and v232._base is base and torch.equal(v232.flatten(), m62.flatten())
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
# it is already contiguous), so `.contiguous().view()` copies even where a view would have done. `t._base` is the
# tensor that owns a view's storage (`None` for a tensor that owns its own).

# %%
results = {
    "m62.reshape(2, 3, 2)": m62.reshape(2, 3, 2),
    "m62.contiguous().view(2, 3, 2)": m62.contiguous().view(2, 3, 2),
    "m62.reshape(3, 4)": m62.reshape(3, 4),
    "m62.contiguous().view(3, 4)": m62.contiguous().view(3, 4),
}
for expr, t in results.items():
    shared = t.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    print(f"{expr:31} {'a view of base' if shared else 'a copy'}  (_base is base: {t._base is base})")
    assert shared == (t._base is base)
print(results["m62.reshape(3, 4)"])
assert [t._base is base for t in results.values()] == [True, False, False, False]
assert torch.equal(results["m62.reshape(2, 3, 2)"], results["m62.contiguous().view(2, 3, 2)"])  # same values
assert torch.equal(results["m62.reshape(3, 4)"], results["m62.contiguous().view(3, 4)"])
assert m26.contiguous() is m26 and m26.contiguous().view(3, 4)._base is base  # contiguous already: no copy

# %% [markdown]
# ## 5. Tensors and NumPy: shared memory (共享内存)
#
# `torch.from_numpy(a)` and `t.numpy()` do not copy: the tensor and the array are two views of the same memory, so
# changing one changes the other. `clone()` makes an independent copy and breaks the link. (`torch.tensor(a)`
# always copies.)

# %%
arr = np.zeros(3)
t = torch.from_numpy(arr)
np.add(arr, 1, out=arr)  # change the array ...
print("array:", arr, " tensor:", t)  # ... and the tensor changed too
assert t.dtype == torch.float64  # NumPy's default float is float64, and from_numpy keeps it

t = torch.zeros(3)
linked, copied = t.numpy(), t.clone().numpy()
t.add_(1)  # the trailing underscore: an in-place method
print("tensor:", t, " .numpy():", linked, " .clone().numpy():", copied)
assert linked[0] == 1.0 and copied[0] == 0.0

# %% [markdown]
# The notes offer `tensor.data.numpy()` as an alternative to `tensor.clone().numpy()`. It is not one: `.data` is a
# tensor on the same storage (detached from autograd), so its array shares memory with the tensor and changes
# when the tensor does. (`.numpy()` refuses a tensor that requires grad; today's spelling of the notes' trick is
# `.detach().numpy()`, which shares memory too.) Only `clone()`, `np.array(t)` or `.copy()` on the array break the
# link.
#
# In the other direction, NumPy arrays can have **negative strides** (`a[::-1]` walks the memory backwards), which
# PyTorch tensors cannot: `torch.from_numpy` refuses them, and the notes' fix is to copy first, `a[::-1].copy()`.

# %%
w = torch.zeros(3, requires_grad=True)
via_data, via_detach, via_clone = w.data.numpy(), w.detach().numpy(), w.detach().clone().numpy()
with torch.no_grad():
    w.add_(5)
print("after w.add_(5):  .data.numpy()", via_data, "| .detach().numpy()", via_detach, "| .clone().numpy()", via_clone)
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
# `item()` turns a one-element tensor into a Python number, `tolist()` a tensor into nested lists.

# %%
s = torch.tensor(1.0).item()
lst = torch.tensor([[1, 2], [3, 4]]).tolist()
print(s, type(s).__name__, "|", lst, type(lst).__name__)
try:
    torch.tensor([1.0, 2.0]).item()
except RuntimeError as err:
    print("item() on 2 elements:", err)

# %% [markdown]
# ### In-place operations (原地操作)
#
# A method ending in `_` (`add_`, `mul_`, `clamp_`, `zero_`) is an **in-place operation** (原地操作): it writes into the
# tensor itself instead of returning a new one; `out=` does the same for functions. They save memory, but autograd
# sometimes needs the old values; notebook 03 shows the error you then get.

# %%
a = torch.tensor([1.0, 2.0, 3.0])
ptr = a.data_ptr()
a.mul_(10).clamp_(max=25)
b = torch.empty(3)
torch.add(a, 1, out=b)
print(a, b)
assert a.data_ptr() == ptr

# %% [markdown]
# ## 6. Images: tensor ↔ PIL ↔ NumPy
#
# Image libraries store pixels as `uint8` in (height, width, channels) order; PyTorch models expect floats in
# (channels, height, width) order. `torchvision.transforms.v2.functional` converts between them; the notes' manual
# recipe (`permute(2, 0, 1)` and `/ 255`) gives the same numbers. The notes' `transforms.functional.to_tensor`
# still works but belongs to the old transforms API: `to_image` + `to_dtype(..., scale=True)` is today's version.

# %%
from PIL import Image
from torchvision.transforms.v2 import functional as TF

rng = np.random.default_rng(0)
hwc = rng.integers(0, 256, size=(4, 6, 3), dtype=np.uint8)  # a tiny 4x6 RGB picture
pil = Image.fromarray(hwc)
chw = TF.to_dtype(TF.to_image(pil), torch.float32, scale=True)  # PIL -> float tensor in [0, 1], (C, H, W)
manual = torch.from_numpy(np.array(pil)).permute(2, 0, 1).float() / 255  # np.array copies: writable memory
back = TF.to_pil_image(chw)  # tensor -> PIL
print("PIL size (W, H):", pil.size, "mode", pil.mode, "| tensor", tuple(chw.shape), chw.dtype)
assert torch.allclose(chw, manual)
assert np.array_equal(np.asarray(back), hwc)  # the round trip is lossless
print("round trip tensor -> PIL -> numpy is exact:", np.array_equal(np.asarray(back), hwc))

# %% [markdown]
# ## 7. Broadcasting (广播) and matrix products (矩阵乘法)
#
# Element-wise operations (`+`, `*`, `torch.mul`) **broadcast**: shapes are aligned from the right, and a dimension
# of size 1 (or a missing one) is stretched to match. In **matrix multiplication** (矩阵乘法), the last dimension of
# the first operand is contracted with the second-to-last of the second:
#
# | function | shapes | broadcasts? |
# |---|---|---|
# | `torch.mm(a, b)` | (m, n) @ (n, p) → (m, p) | no, 2-D only |
# | `torch.bmm(a, b)` | (b, m, n) @ (b, n, p) → (b, m, p) | no, 3-D only, same batch |
# | `torch.matmul(a, b)`, `a @ b` | (..., m, n) @ (..., n, p) → (..., m, p) | yes, over the leading dims |
# | `a * b`, `torch.mul` | element-wise | yes |

# %%
col, row = torch.arange(3).view(3, 1), torch.arange(4)
print("(3,1) + (4,) ->", tuple((col + row).shape))
print(col * 10 + row)
print("broadcast_shapes((2,1,3,4), (5,1,1)) =", tuple(torch.broadcast_shapes((2, 1, 3, 4), (5, 1, 1))))
stretched = torch.broadcast_tensors(col * 10, row)  # what broadcasting does, made visible (as views: stride 0)
print("strides of the stretched operands:", [t.stride() for t in stretched])
assert torch.equal(stretched[0] + stretched[1], col * 10 + row) and stretched[0].stride() == (1, 0)

fig, axes = plt.subplots(1, 3, figsize=(8, 2.2))
panels = (
    ("col * 10: (3, 1) -> (3, 4)", stretched[0]),
    ("row: (4,) -> (3, 4)", stretched[1]),
    ("sum: (3, 4)", stretched[0] + stretched[1]),
)
for ax, (title, grid) in zip(axes, panels):
    grid = grid.contiguous()  # matplotlib wants real memory, not a stride-0 view
    ax.imshow(grid.numpy(), cmap="Blues", vmin=-5, vmax=30)
    for (i, j), value in np.ndenumerate(grid.numpy()):
        ax.text(j, i, str(value), ha="center", va="center", fontsize=9)
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
fig.suptitle("Broadcasting repeats size-1 dimensions (stride 0, no copy) until the shapes match", fontsize=10)
plt.show()

a, b = torch.ones(2, 3), torch.ones(3, 4)
print("mm :", tuple(torch.mm(a, b).shape))
print("bmm:", tuple(torch.bmm(torch.ones(8, 2, 3), torch.ones(8, 3, 4)).shape))
a, b = torch.ones(2, 1, 3, 4), torch.ones(5, 4, 2)  # the notes' example
c = torch.matmul(a, b)
print("matmul (2,1,3,4) @ (5,4,2) ->", tuple(c.shape))
assert c.shape == (2, 5, 3, 2) and torch.all(c == 4)  # every entry sums 4 products of ones
try:
    torch.mm(torch.ones(2, 1, 3, 4), torch.ones(5, 4, 2))
except RuntimeError as err:
    print("mm refuses >2-D:", err)

# %% [markdown]
# `matmul` with batch dimensions is the same as looping over the batch with `mm`: the batch dims `(2, 1)` and `(5,)`
# broadcast to `(2, 5)`. "The same" up to rounding: the batched kernel may add the four products of each entry in
# another order than `mm` does, and float32 addition is not associative, so the last bits can differ (how, depends on
# the CPU). Compare floats with `torch.testing.assert_close`, whose tolerances suit the dtype (for float32: relative
# 1.3e-6, absolute 1e-5); `torch.equal` or `allclose` with its default absolute tolerance of 1e-8 can fail on a
# value near zero.

# %%
a, b = torch.randn(2, 1, 3, 4), torch.randn(5, 4, 2)
looped = torch.stack([torch.stack([a[i, 0] @ b[j] for j in range(5)]) for i in range(2)])
torch.testing.assert_close(a @ b, looped)
print("a @ b equals the loop of mm up to float32 rounding:", tuple((a @ b).shape))

# %% [markdown]
# ## 8. Flipping, normalising and comparing
#
# Slicing works as in NumPy, except that **negative steps are not allowed** (`t[::-1]` raises): strides are never
# negative in PyTorch. The notes reverse a dimension by indexing with a reversed `arange`; `torch.flip` says the
# same thing directly (both copy).

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
# The notes also list `torch.nn.functional.normalize(x, p=2, dim=1)`: it divides each row by its length (its
# L2 norm along `dim`, floored at `eps` so that a zero row does not divide by zero), as in their example `[[6, 8]]`
# → `[[0.6, 0.8]]`. It is a reduction with `keepdim=True` followed by a broadcast division.

# %%
v = torch.tensor([[6.0, 8.0], [0.0, 0.0]])
unit = F.normalize(v, p=2.0, dim=1)
print("F.normalize:", [[round(value, 4) for value in r] for r in unit.tolist()])
assert torch.equal(unit[:1], v[:1] / v[:1].norm(dim=1, keepdim=True)) and unit[1].tolist() == [0.0, 0.0]

# %% [markdown]
# `torch.equal` asks "same shape and exactly the same values" — right for integers. For floats, rounding makes exact
# equality fragile: `torch.allclose` (and `torch.testing.assert_close`, which also explains a mismatch) compare with
# a tolerance.

# %%
x = torch.tensor([0.1, 0.2], dtype=torch.float64).sum()
y = torch.tensor(0.3, dtype=torch.float64)
print(f"0.1 + 0.2 = {x.item()!r}, 0.3 = {y.item()!r}")
print("equal:", torch.equal(x, y), "| allclose:", torch.allclose(x, y))
print("integers compare exactly:", torch.equal(torch.arange(3), torch.tensor([0, 1, 2])))
assert not torch.equal(x, y) and torch.allclose(x, y)
torch.testing.assert_close(x, y)  # passes silently; on a real mismatch it names the worst element

# %% [markdown]
# ## 9. `clone` versus `detach`
#
# | | new memory? | stays in the autograd graph? |
# |---|---|---|
# | `t.clone()` | yes | yes (gradients flow back through it) |
# | `t.detach()` | no, shares memory | no |
# | `t.detach().clone()` | yes | no — an independent snapshot |
#
# The notes write `tensor.detach.clone()()`, a typo for `tensor.detach().clone()`.

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
# ## 10. Naming dimensions: einops instead of named tensors
#
# The notes show *named tensors*: `torch.randn(32, 3, 56, 56, names=('N', 'C', 'H', 'W'))`, `images.sum('C')` and
# `align_to`. That prototype feature is **gone from PyTorch 2.14**: `names=` is no longer accepted.

# %%
try:
    torch.randn(32, 3, 56, 56, names=("N", "C", "H", "W"))
except TypeError as err:
    print("names= ->", type(err).__name__, "-", str(err).splitlines()[0])
print("Tensor.align_to exists:", hasattr(torch.Tensor, "align_to"))

# %% [markdown]
# The notes also recommend [einops](https://einops.rocks) ("贼强": very strong), and it is the better tool: the names
# live in a readable pattern string, every operation checks the shapes it is given, and it works on any tensor.
# `rearrange` reorders/merges/splits axes, `reduce` sums or averages over named axes, `repeat` tiles.

# %%
from einops import rearrange, reduce, repeat

images = torch.randn(32, 3, 56, 56)
per_channel_sum = reduce(images, "n c h w -> n h w", "sum")  # the notes' images.sum('C')
assert torch.allclose(per_channel_sum, images.sum(dim=1))
nhwc = rearrange(images, "n c h w -> n h w c")  # the notes' align_to, for channels-last
patches = rearrange(images, "n c (h p1) (w p2) -> n (h w) (p1 p2 c)", p1=14, p2=14)  # ViT-style patches
pooled = reduce(images, "n c (h 2) (w 2) -> n c h w", "max")  # 2x2 max pooling
tiled = repeat(torch.arange(3), "c -> n c", n=2)
for name, t in [("sum over c", per_channel_sum), ("channels last", nhwc), ("patches", patches), ("max pool", pooled)]:
    print(f"{name:14} {tuple(t.shape)}")
print(tiled)
assert torch.equal(pooled, torch.nn.functional.max_pool2d(images, 2))
try:
    rearrange(images, "n c h w -> n (c h w) x")
except Exception as err:  # einops.EinopsError
    print(type(err).__name__, "-", str(err).splitlines()[-1])

# %% [markdown]
# ## 11. Devices (设备)
#
# A tensor lives on one **device** (设备); operations need their operands on the same device. `utils.get_device()` picks
# CUDA, then Apple's MPS, then the CPU (set `TORCH_COURSE_DEVICE=cpu` to force the CPU). `.to(device)` copies a tensor
# there (and returns the tensor itself if it is already there); results come back with `.cpu()` before `.numpy()`. The
# tests of this course run on the CPU (they hide any GPU); on a GPU machine the same cells run on `cuda`.
#
# PyTorch 2.6+ also has a device-neutral API, `torch.accelerator`: `is_available()` says whether an accelerator
# (CUDA, MPS, XPU, ...) can be used, `device_count()` how many there are, and
# `current_accelerator(check_available=True)` which one, or `None` when there is none. Without `check_available`
# it names the accelerator this *build* of PyTorch was made for, even on a machine without one (a CUDA wheel
# says `cuda`), so code that picks a device should pass `check_available=True`. The cell prints the CPU facts on
# a machine without an accelerator, and the accelerator's on a machine with one.

# %%
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
# Three exercises, easiest first: predict, write a function, then a stretch that combines several sections.
# Each has a **stub cell** that starts with `# ✏️ Exercise N`: edit it and run it. The **check cell** below it
# then says *correct*, or *not yet* with a hint and the section to re-read, or *not attempted yet* while the
# stub is untouched. This section does not depend on the lesson's cells: after a kernel restart, run its first
# cell and go on. `make progress` lists which exercises of every notebook pass.

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
# for any sizes.


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
# of `b` nearest to `a[i]` (shape `(n,)`). No Python loop: broadcast `a` and `b` against each other with `None`
# (section 3's indexing), then reduce. This is the core of k-nearest-neighbour classifiers and k-means.


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
#   `torch.IntTensor(n)`, which allocates garbage. Python ints become `int64`, floats `float32` (NumPy: `float64`).
# - Reductions (归约) take `dim` (removed) and `keepdim=True` (kept with size 1, ready to broadcast); `cat` joins
#   along an existing dimension, `stack` along a new one; `unsqueeze/squeeze/permute` reshape the dimensions.
# - Basic indexing (integers, slices, `None`, `...`) gives views; advanced indexing (index lists, masks) gives
#   copies, but assignment through it (`x[mask] = 0`) writes in place. The notes' `x[[0, 2], None]` is
#   `x[[0, 2]].unsqueeze(1)`.
# - A tensor is storage (存储) + offset + shape + strides (步长). A transpose swaps sizes and strides and moves
#   nothing. `view` works whenever the requested shape can be expressed with the existing strides, contiguous or
#   not; `reshape` always works and copies only when it must; `.contiguous().view()` gives the same values but
#   copies every non-contiguous tensor.
# - `from_numpy`/`.numpy()` share memory, and so does the notes' `.data.numpy()`; `clone()` copies;
#   `from_numpy` refuses NumPy's negative strides (the notes' `.copy()` first). `detach()` leaves the graph but
#   shares memory.
# - Broadcasting (广播) aligns shapes from the right and stretches size-1 dimensions with stride 0, without
#   copying; `mm` is 2-D, `bmm` batched 3-D, `matmul`/`@` broadcasts the batch dimensions.
# - No negative-step slicing: use `torch.flip`. `F.normalize` divides by the norm along `dim`. Compare floats
#   with `allclose`/`assert_close`.
# - Named tensors are gone: name dimensions with einops patterns.
# - Move data with `.to(device)`; pick the device once, with `get_device()` or
#   `torch.accelerator.current_accelerator(check_available=True)`.
#
# Next: **02 · autograd** — how PyTorch computes gradients.
