# %% [markdown]
# # 06 · Saving, loading and checkpoints (保存和加载模型)
#
# **You will learn to**
#
# * read what a model's and an optimizer's **`state_dict`** (状态字典) hold, save a model's weights and load them
#   back the recommended way, and explain why pickling a whole model breaks;
# * load files safely: what `torch.load(..., weights_only=True)` (the default since PyTorch 2.6) refuses, what this
#   allow-list does *not* promise, and why weights from strangers should come as `safetensors`;
# * write a full training **checkpoint** (检查点), every random state included, and **resume training** (断点续训)
#   so that the run ends **bit-identical** to one that never stopped;
# * save so that a crash cannot tear the file (an **atomic save**, 原子保存), first by hand, then with the course's
#   helper, and recover from torn and damaged files;
# * **warm-start** (热启动) a different model, rename keys, load across devices with `map_location`, load a large
#   model lazily (`mmap=True`, the `meta` device), and deal with the `module.` and `_orig_mod.` prefixes that
#   `DataParallel`, DDP and `torch.compile` add;
# * export a model for deployment with `torch.export`.
#
# **Before this notebook.** Notebooks 01–04: tensors, autograd, `nn.Module`, and a training loop with an optimizer,
# an LR scheduler and a `DataLoader` (notebook 04). Notebook 05 is not needed.
#
# **Study time:** about 150 min, 30 of them for the exercises at the end. The cells run in about a minute; most
# of that goes to importing PyTorch's compiler stack (`torch.compile`, `torch.export`) and to a child Python
# process that section 6 kills on purpose.
#
# **On a GPU.** The `map_location` cells run their CUDA branch (a CPU machine prints what would happen instead);
# the random states saved in section 5 then include CUDA's (or MPS's, on an Apple GPU), and the resume
# demonstration runs on the GPU.
#
# **Run the cells in order.** A cell that needs something made in an earlier section starts with
# `needs(...)`: if you skipped that section, it stops and names the cell to run.
#
# This lesson grew out of a teacher's study notes on PyTorch 1.x (in Chinese). What has changed since, or was wrong
# there, is listed in a last section for readers who have them; everyone else can stop at the summary.

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
# `seed_everything(0)` seeds Python's `random`, NumPy and torch (used since notebook 01; notebook 12 explains it); `get_device()` picks CUDA, then
# Apple's MPS, then the CPU. Every file this notebook writes goes into one folder, `RUN_DIR`, emptied at each
# run. Three small helpers keep the output readable and the cells honest: `short` prints error messages with paths
# relative to the course folder, `first_line` keeps an error's first line, and `needs` checks that the cells a cell
# builds on have run.

# %%
import contextlib
import dataclasses
import io
import json
import os
import pickle
import pickletools
import random
import re
import secrets
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import warnings
import zipfile
from collections import OrderedDict
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from utils import REPO_ROOT, get_device, relpath, seed_everything, show_warning
from utils.checkpoint_files import (
    CheckpointError,
    atomic_torch_save,
    list_checkpoints,
    load_checkpoint,
    load_rng_state_dict,
    rng_state_dict,
    save_checkpoint,
    unwrap_model,
)

seed_everything(0)
device = get_device()
RUN_DIR = REPO_ROOT / "runs" / "06_save_load_checkpoints"
shutil.rmtree(RUN_DIR, ignore_errors=True)  # every run starts from an empty folder
RUN_DIR.mkdir(parents=True)


def short(text) -> str:
    """Error messages name files by absolute path: print them relative to the course folder."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(text))  # torch colours parts of some messages
    return text.replace(str(REPO_ROOT) + os.sep, "")


def first_line(err: BaseException) -> str:
    return short(str(err).strip().splitlines()[0])


def needs(*names: str, run: str) -> None:
    """Stop with a clear message if an earlier cell that this one builds on has not run."""
    missing = [name for name in names if name not in globals()]
    if missing:
        raise NameError(f"not defined yet: {', '.join(missing)}. Run {run}, then this cell again.")


print("torch", torch.__version__.split("+")[0], "| device:", device.type, "| files go to", relpath(RUN_DIR))

# %% [markdown]
# ## 1. What a `state_dict` is
#
# Three functions do all the work:
#
# * `torch.save(obj, path)` does the **serialisation** (序列化): it turns an object into bytes with Python's
#   `pickle`, inside a zip file;
# * `torch.load(path)` does the **deserialisation** (反序列化): it unpickles them again;
# * `module.load_state_dict(sd)` copies a dictionary of tensors into a model's parameters and buffers.
#
# A model's `state_dict` maps the name of each **parameter** (参数) and **buffer** (缓冲区) to its tensor. The
# names are attribute paths: `conv1.weight` is `model.conv1.weight`. Layers without parameters (`MaxPool2d`,
# `ReLU`) have no entries. An optimizer's `state_dict` has two parts: `state` (per-parameter tensors such as
# SGD's momentum buffer, empty before the first step) and `param_groups` (the hyper-parameters, and under `params`
# the parameters of each group, written as their positions `0, 1, 2, …`). Here is the small CNN of PyTorch's own
# saving tutorial, `TheModelClass`:


# %%
class TheModelClass(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


model = TheModelClass()
optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)

print("Model's state_dict:")
for name, tensor in model.state_dict().items():
    print(f"  {name:<13} {tuple(tensor.shape)}")
print("Optimizer's state_dict:")
for key, value in optimizer.state_dict().items():
    print(f"  {key:<13} {value}")

assert optimizer.state_dict()["param_groups"][0]["params"] == list(range(10))
assert not any(name.startswith("pool") for name in model.state_dict())  # no parameters, no entry

# %% [markdown]
# ### 1.1 Buffers: saved state that is not trained
#
# `BatchNorm` keeps running statistics (`running_mean`, `running_var`, and a counter `num_batches_tracked`) as
# buffers: they are not parameters (no gradient, the optimizer never sees them), but a model evaluated without them
# gives different answers, so they are in the `state_dict`. Your own module can register buffers too, with
# `register_buffer`; `persistent=False` keeps one out of the `state_dict` (for a cache you can recompute).
#
# **In which order?** Module by module: a module's own parameters, then its own buffers, then the entries of each
# sub-module, the sub-modules in the order they were assigned. So `Normalized` below lists its own buffer `scale`
# *first*, although `scale` was registered after the layers `fc` and `bn`.
#
# Beware: a `state_dict` holds **references** to the live tensors, not copies. Keeping `best = model.state_dict()`
# in memory and training on silently changes `best`; clone the tensors to keep a snapshot.


# %%
class Normalized(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)
        self.register_buffer("scale", torch.tensor(2.0))  # saved with the weights
        self.register_buffer("cache", torch.zeros(4), persistent=False)  # not saved

    def forward(self, x):
        return self.bn(self.fc(x)) * self.scale


norm = Normalized()
param_names = dict(norm.named_parameters())
for name, tensor in norm.state_dict().items():
    print(f"{name:<22} {'parameter' if name in param_names else 'buffer':<9} {tuple(tensor.shape)}")
assert "cache" in dict(norm.named_buffers()) and "cache" not in norm.state_dict()
own_first = ["scale", "fc.weight", "fc.bias", "bn.weight", "bn.bias"]
assert list(norm.state_dict()) == own_first + ["bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]

live = norm.state_dict()
snapshot = {name: tensor.clone() for name, tensor in live.items()}
with torch.no_grad():
    norm.fc.weight.add_(1.0)  # "training goes on"
print("plain state_dict still equals the live weight:", torch.equal(live["fc.weight"], norm.fc.weight))
print("cloned snapshot still equals the live weight: ", torch.equal(snapshot["fc.weight"], norm.fc.weight))
assert live["fc.weight"].data_ptr() == norm.fc.weight.data_ptr()
assert not torch.equal(snapshot["fc.weight"], norm.fc.weight)

# %% [markdown]
# ### 1.2 The optimizer's state: one entry per parameter, matched by position
#
# After one optimizer step the `state` part fills up: SGD with momentum keeps one momentum buffer per parameter,
# Adam keeps two (`exp_avg`, `exp_avg_sq`) plus a one-number `step` count. That is why a training checkpoint is
# often quoted as "two to three times the size of the model". Measured on the bytes `torch.save` writes:


# %%
needs("TheModelClass", run="the first cell of section 1")


def saved_size(obj) -> int:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getbuffer().nbytes


images = torch.randn(4, 3, 32, 32)
for make_optimizer in (lambda p: torch.optim.SGD(p, lr=0.001, momentum=0.9), lambda p: torch.optim.Adam(p)):
    net = TheModelClass()
    opt = make_optimizer(net.parameters())
    net(images).sum().backward()
    opt.step()
    ratio = saved_size({"model": net.state_dict(), "optimizer": opt.state_dict()}) / saved_size(net.state_dict())
    print(
        f"{type(opt).__name__:<4} per-parameter state {sorted(opt.state_dict()['state'][0])} "
        f"-> checkpoint / weights = {ratio:.1f}x"
    )
    assert 1.9 < ratio < 3.1

# %% [markdown]
# The optimizer knows its parameters only as positions, in the order `model.parameters()` gave them.
# (Old PyTorch versions wrote Python object ids there instead of `0, 1, 2, …`, and old tutorials still print
# them; the ids were only labels.) Either way, `optimizer.load_state_dict` pairs the saved entries with the new
# optimizer's parameters **by position**. A saved optimizer state therefore fits any optimizer built the same
# way, and **silently misfits** one whose parameters come in another order: same shapes, wrong momentum, no
# error. Below, a refactoring swaps two lines of `__init__`. The model's weights still load correctly (by name),
# but layer `a` receives the momentum of layer `b`:


# %%
class Pair(nn.Module):
    def __init__(self, b_first: bool = False):
        super().__init__()
        if b_first:  # the same layers, assigned in the other order
            self.b = nn.Linear(4, 4)
            self.a = nn.Linear(4, 4)
        else:
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)

    def forward(self, x):
        return self.b(self.a(x))


seed_everything(0)
old = Pair()
old_opt = torch.optim.SGD(old.parameters(), lr=0.1, momentum=0.9)
old(torch.randn(8, 4)).pow(2).sum().backward()
old_opt.step()
print("saved param_groups[0]['params']:", old_opt.state_dict()["param_groups"][0]["params"])

new = Pair(b_first=True)
new.load_state_dict(old.state_dict())  # keys are names: a.weight goes to a.weight
new_opt = torch.optim.SGD(new.parameters(), lr=0.1, momentum=0.9)
new_opt.load_state_dict(old_opt.state_dict())  # positions: no error, no warning
momentum_of_a = new_opt.state[new.a.weight]["momentum_buffer"]
print("model: a.weight loaded by name, equal to the saved a.weight:", torch.equal(new.a.weight, old.a.weight))
print(
    "optimizer: the momentum now attached to a.weight is the saved momentum of",
    "b.weight" if torch.equal(momentum_of_a, old_opt.state[old.b.weight]["momentum_buffer"]) else "a.weight",
)
assert torch.equal(new.a.weight, old.a.weight)
assert torch.equal(momentum_of_a, old_opt.state[old.b.weight]["momentum_buffer"])
assert not torch.equal(momentum_of_a, old_opt.state[old.a.weight]["momentum_buffer"])

# %% [markdown]
# ### 1.3 `parameters()` can be read only once
#
# `model.parameters()` returns a **generator** (生成器): it hands out the parameters one by one, once. A
# `state_dict()` is a dictionary that you can read as often as you like. A generator kept in a variable is empty
# the second time it is read, and the usual symptom is an optimizer that receives nothing:


# %%
needs("TheModelClass", run="the first cell of section 1")
net = TheModelClass()
gen = net.parameters()
print(type(gen).__name__, "| numbers in the parameters:", sum(p.numel() for p in gen))
empty = None
try:
    torch.optim.SGD(gen, lr=0.1)  # the same generator, a second time
except ValueError as err:
    empty = err
    print("torch.optim.SGD(gen) ->", type(err).__name__ + ":", err)
params = list(net.parameters())  # a list can be read any number of times
print("from a list:", sum(p.numel() for p in params), "numbers, optimizer with", len(params), "tensors")
opt = torch.optim.SGD(params, lr=0.1)
assert empty is not None and len(opt.param_groups[0]["params"]) == len(net.state_dict()) == 10

# %% [markdown]
# ## 2. Save and load the `state_dict` (recommended)
#
# Save only the `state_dict`; to load, **build the model from its class first**, then copy the weights in. The
# conventional extensions are `.pt` or `.pth`; the name does not matter to PyTorch. `load_state_dict` returns the
# keys that did not match (none here). A freshly built model is in training mode: call `model.eval()` before using
# it, or dropout stays active and BatchNorm normalises with the current batch instead of the running statistics it
# just loaded; worse, every training-mode forward pass *updates* those statistics, so even a "quick check" damages
# what you loaded. The file is a zip archive: a small pickle (`data.pkl`) that describes the dictionary, and one
# raw-bytes record per storage (one per tensor, unless tensors share memory).


# %%
class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 32)
        self.bn = nn.BatchNorm1d(32)
        self.drop = nn.Dropout(0.2)
        self.fc2 = nn.Linear(32, 2)

    def forward(self, x):
        return self.fc2(self.drop(F.relu(self.bn(self.fc1(x)))))


seed_everything(0)
small = SmallNet()
small_opt = torch.optim.SGD(small.parameters(), lr=0.1)
for _ in range(5):  # a little training moves the weights and the BatchNorm statistics
    x = torch.randn(16, 10)
    loss = F.cross_entropy(small(x), (x[:, 0] > 0).long())
    small_opt.zero_grad()
    loss.backward()
    small_opt.step()
small.eval()

weights_path = RUN_DIR / "small.pt"
torch.save(small.state_dict(), weights_path)
with zipfile.ZipFile(weights_path) as zf:
    print("inside", relpath(weights_path), ":", [name.split("/", 1)[1] for name in zf.namelist()][:6], "...")

restored = SmallNet()
print("load_state_dict ->", restored.load_state_dict(torch.load(weights_path)))
probe = torch.randn(8, 10)
print("a fresh model is in training mode:", restored.training)
same_in_train_mode = torch.equal(restored(probe), small(probe))
print("  same outputs as the saved model:", same_in_train_mode)
stats_changed = not torch.equal(restored.bn.running_mean, small.bn.running_mean)
print("  and that forward pass changed the loaded BatchNorm statistics:", stats_changed)
restored.load_state_dict(torch.load(weights_path))
restored.eval()
print("reloaded, then eval(): same outputs:", torch.equal(restored(probe), small(probe)))
assert restored.training is False and not same_in_train_mode and stats_changed
assert torch.equal(restored(probe), small(probe))

# %% [markdown]
# ## 3. Saving the whole model, and why it breaks
#
# `torch.save(model, path)` also works, but pickle does **not** store the class's code: it stores a
# *reference*, the module path and the class name (`__main__ SmallNet` below), plus the object's
# attributes. Loading imports that module and looks the name up again. Rename the class, move the file that
# defines it, or load from another project, and the lookup fails. This is the classic "the model saved last
# month no longer loads, for no clear reason" (with `ModuleNotFoundError: No module named 'network'` when the
# file `network.py` was moved). Since PyTorch 2.6, `torch.load` also refuses such a file by default, because
# running arbitrary classes is exactly what `weights_only=True` forbids (next section); a file you made yourself
# may be loaded with `weights_only=False`.
#
# To see what a pickle refers to, `pickletools.genops` (from Python's standard library) lists its instructions
# without running any; a `GLOBAL` instruction names a class or function to import.

# %%
needs("small", "probe", run="the cell of section 2")
whole_path = RUN_DIR / "small_whole.pt"
torch.save(small, whole_path)
with zipfile.ZipFile(whole_path) as zf:
    pkl = zf.read(next(name for name in zf.namelist() if name.endswith("data.pkl")))
globals_in_file = [arg for op, arg, _ in pickletools.genops(pkl) if op.name == "GLOBAL"]
print("classes and functions the pickle refers to:", globals_in_file[:4], "...")
assert "__main__ SmallNet" in globals_in_file

refused = False
try:
    torch.load(whole_path)
except pickle.UnpicklingError as err:
    reason = next(line for line in str(err).splitlines() if "WeightsUnpickler" in line)
    print("default torch.load ->", type(err).__name__, ":", reason.strip().split(" was not")[0])
    refused = True

same = torch.load(whole_path, weights_only=False)  # acceptable only because we wrote this file
print("weights_only=False on our own file:", type(same).__name__, torch.equal(same(probe), small(probe)))
assert refused and torch.equal(same(probe), small(probe))

renamed_failed = False
RenamedNet = SmallNet  # a refactoring renames the class...
del SmallNet
try:
    torch.load(whole_path, weights_only=False)
except AttributeError as err:
    print("after renaming the class ->", type(err).__name__, ":", re.sub(r" from '[^']*'", "", str(err)))
    renamed_failed = True
finally:
    SmallNet = RenamedNet  # put it back for the rest of the notebook
assert renamed_failed

# %% [markdown]
# ## 4. `torch.load` runs code: `weights_only=True`
#
# Unpickling is a small program: the `GLOBAL` instruction imports any function, `REDUCE` calls it
# with arguments from the file. An object's `__reduce__` method decides what is written, so a
# "checkpoint" downloaded from the internet can run any code on `torch.load` with
# `weights_only=False`, which was the default before PyTorch 2.6: a bare `torch.load(PATH)`, as older code and
# tutorials write it, ran whatever the file asked for.
#
# We build such a file, harmlessly: its payload would call `io.FileIO(marker, "w")` (the raw file that
# `open()` builds on), creating an empty marker file in a temporary folder. We **do not** load it with
# `weights_only=False`; reading its instructions with `pickletools` is proof enough of what that would do.
# `weights_only=True` switches to PyTorch's own unpickler (`torch/_weights_only_unpickler.py`), which
# executes only a subset of the pickle instructions: `GLOBAL` never imports anything, it only looks the name
# up in an **allow-list** (允许列表: tensor and storage rebuild functions, dtypes, `torch.Size`, `torch.device`,
# `nn.Parameter`, `OrderedDict`, `Counter`, `set`, plus what you add yourself; names from `os` and `sys` are
# refused even then); `REDUCE` calls only allow-listed functions; `BUILD` only fills tensors, parameters,
# `OrderedDict`s and allow-listed classes; any other instruction is an error. Our file is refused at
# `GLOBAL _io FileIO`, before anything is called, and the marker does not appear. We pass
# `weights_only=True` although it is the default, because the environment variable
# `TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1` turns the default off (with only a warning) but never overrides an
# explicit argument; the end of the cell proves it with our own pickled model from section 3.
#
# Two tools in that cell: `unittest.mock.patch.dict(os.environ, {...})` sets an environment variable only
# inside its `with` block; the course's `show_warning(fn, Category, text)` runs `fn()`, prints the warning it
# raises (category and first sentence), returns `fn()`'s result, and stops with an error if that warning does not
# come.


# %%
class Booby:
    """Unpickling this object would call io.FileIO(marker, "w"): harmless, but it proves code ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        # FileIO, not open: pickle names open by its module, io up to Python 3.11 and _io from 3.12
        return (io.FileIO, (self.marker, "w"))


needs("whole_path", "SmallNet", run="the cells of sections 2 and 3")
with tempfile.TemporaryDirectory() as tmp:
    marker = os.path.join(tmp, "code_ran.txt")
    evil_path = os.path.join(tmp, "innocent_weights.pt")
    torch.save({"weight": torch.zeros(2), "bonus": Booby(marker)}, evil_path)

    with zipfile.ZipFile(evil_path) as zf:
        pkl = zf.read(next(name for name in zf.namelist() if name.endswith("data.pkl")))
    ops = [(op.name, arg) for op, arg, _ in pickletools.genops(pkl)]
    print("imports in the file:", [arg for name, arg in ops if name == "GLOBAL"])
    print("calls (REDUCE) in the file:", sum(name == "REDUCE" for name, _ in ops))

    refused = False
    try:
        torch.load(evil_path, weights_only=True)  # explicit, so that no environment variable can turn it off
    except pickle.UnpicklingError as err:
        refused = True
        print(type(err).__name__, ":", first_line(err))
        detail = next(line for line in str(err).splitlines() if "WeightsUnpickler" in line)
        print("   ", detail.strip().split(" Please")[0])
    print("marker file created:", os.path.exists(marker))
    assert refused and not os.path.exists(marker)
    assert ("GLOBAL", "_io FileIO") in ops

with mock.patch.dict(os.environ, {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}):
    # the default, turned off: the whole pickle runs
    by_default = show_warning(lambda: torch.load(whole_path), UserWarning, "forcing weights_only=False")
    try:
        torch.load(whole_path, weights_only=True)
        explicit_refused = False
    except pickle.UnpicklingError:
        explicit_refused = True
print(
    "with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 the default torch.load unpickles a",
    type(by_default).__name__,
    "| weights_only=True still refuses it:",
    explicit_refused,
)
assert isinstance(by_default, SmallNet) and explicit_refused

# %% [markdown]
# ### 4.1 Allowing a class you trust
#
# The error message offers two ways out. `weights_only=False` means "I trust this file completely": never for
# files from others. For a **trusted custom type** in your own checkpoints, allow exactly that class with
# `torch.serialization.add_safe_globals([...])` (for the whole process) or the
# `torch.serialization.safe_globals([...])` context manager (for one load). To see what a file would need before
# allowing anything, `torch.serialization.get_unsafe_globals_in_checkpoint(path)` lists the names it refers to
# outside the allow-list, without loading it. Better still, store plain data: `dataclasses.asdict(config)` needs
# no allow-list at all.


# %%
@dataclasses.dataclass
class TrainConfig:
    lr: float = 0.1
    batch_size: int = 32


needs("small", run="the cell of section 2")
config_path = RUN_DIR / "with_config.pt"
torch.save({"weights": small.state_dict(), "config": TrainConfig()}, config_path)
print("outside the allow-list:", torch.serialization.get_unsafe_globals_in_checkpoint(config_path))
refused = False
try:
    torch.load(config_path, weights_only=True)
except pickle.UnpicklingError as err:
    refused = True
    print("weights_only=True ->", type(err).__name__, "(TrainConfig is not on the allow-list)")
with torch.serialization.safe_globals([TrainConfig]):
    print("with safe_globals([TrainConfig]) ->", torch.load(config_path, weights_only=True)["config"])

torch.save({"weights": small.state_dict(), "config": dataclasses.asdict(TrainConfig())}, config_path)
plain = torch.load(config_path, weights_only=True)["config"]
print("stored as a plain dict ->", plain, "->", TrainConfig(**plain))
assert refused and TrainConfig(**plain) == TrainConfig()

# %% [markdown]
# ### 4.2 An allow-list, not a sandbox
#
# `weights_only=True` is a **mitigation**, not a security boundary. The allowed functions still run
# with arguments taken from the file, behind them sits C++ code that parses sizes, strides and
# offsets, and `torch.load` itself chooses how to read a file; a bug in any of this machinery is a
# way around the allow-list. It has happened at least twice: CVE-2025-32434 ran code through it (fixed in
# PyTorch 2.6), and CVE-2026-24747, a memory corruption reached through a crafted file, again (fixed in 2.10).
# So:
#
# * files you or your team wrote: `torch.load(path, weights_only=True)`, written out (never `False`);
# * weights from people you do not trust: ask for **`safetensors`** (next), whose loader only parses
#   a JSON header and copies bytes;
# * keep PyTorch updated, since the next bypass will be fixed in a release, not in your code.

# %%
torch_version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
print(
    "torch",
    ".".join(map(str, torch_version)),
    "| has the 2.6 fix:",
    torch_version >= (2, 6),
    "| has the 2.10 fix:",
    torch_version >= (2, 10),
)
assert torch_version >= (2, 10)

# %% [markdown]
# ### 4.3 `safetensors`: a format with no code in it
#
# To *share* weights, the `safetensors` format (Hugging Face) has no code in it: 8 bytes giving the
# header length, a JSON header (name → dtype, shape, byte range, plus optional string metadata), then
# raw tensor bytes. There is nothing to execute, and it allows **memory mapping** (内存映射, section 8.1).
# Two limits: it stores only tensors (metadata must be strings), and it refuses tensors that share
# memory (as in **weight tying** (权重共享)) in `save_file`; `save_model`/`load_model` handle those.
#
# The cell reads the header itself: `struct.unpack("<Q", raw[:8])` decodes the first 8 bytes as one unsigned
# 64-bit integer in little-endian order (`<` little-endian, `Q` unsigned 64-bit; Python's `struct` module reads
# binary formats). Then it ties weights in a tiny language model: `nn.Embedding(20, 8)` is a learnable table of
# 20 vectors of 8 numbers, one per token id, looked up by index (notebook 05 uses it), and the output layer
# reuses that table as its weight. The header does not list the tensors in `state_dict` order: they are grouped by
# dtype (the int64 counter `bn.num_batches_tracked` comes first), then sorted by name, the order of their bytes in
# the file.

# %%
needs("small", run="the cell of section 2")
st_path = RUN_DIR / "small.safetensors"
save_file(small.state_dict(), st_path, metadata={"epoch": "5"})
raw = st_path.read_bytes()
header_len = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8 : 8 + header_len])
print("metadata:", header.pop("__metadata__"))
for name, info in header.items():
    print(f"  {name:<22} {info['dtype']} {info['shape']}")
loaded = load_file(st_path)
assert all(torch.equal(loaded[k], v) for k, v in small.state_dict().items())


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.out = nn.Linear(8, 20, bias=False)
        self.out.weight = self.embed.weight  # one tensor, two names


tied = TiedLM()
refused = False
try:
    save_file(tied.state_dict(), RUN_DIR / "tied.safetensors")
except RuntimeError as err:
    refused = True
    print("save_file with tied weights ->", type(err).__name__, ":", first_line(err).split(":")[0])
save_model(tied, RUN_DIR / "tied.safetensors")
tied_again = TiedLM()
load_model(tied_again, RUN_DIR / "tied.safetensors")
print(
    "save_model/load_model keep the tie:",
    tied_again.out.weight is tied_again.embed.weight,
    torch.equal(tied_again.out.weight, tied.embed.weight),
)
assert refused and torch.equal(tied_again.out.weight, tied.embed.weight)

# %% [markdown]
# ## 5. A training checkpoint
#
# A **checkpoint** (检查点) is a file holding everything needed to continue a training run later, for
# **resuming training** (断点续训) after a crash or a time limit. ([Notebook 11](11_memory_and_speed.ipynb) meets
# *activation checkpointing* (激活重计算), which is unrelated: it recomputes activations in the backward pass
# to save memory and writes no file.) To *continue* training, weights are not enough. The recipe found in most
# tutorials, PyTorch's own included, saves one dictionary with the epoch, the model's and the optimizer's
# `state_dict`s and the last loss, often with the extension `.tar` (any name works: the file is a zip either
# way). Loading builds the model and optimizer first, then restores both. Here is that minimal recipe on a small
# classifier, with a toy data set:


# %%
class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 2))

    def forward(self, x):
        return self.net(x)


data_gen = torch.Generator().manual_seed(42)
X_ALL = torch.randn(256, 10, generator=data_gen)
Y_ALL = (X_ALL[:, 0] + 0.5 * X_ALL[:, 1] > 0).long()
BATCH, STEPS_PER_EPOCH, EPOCHS = 32, 256 // 32, 3

seed_everything(0)
clf = Classifier()
clf_opt = torch.optim.SGD(clf.parameters(), lr=0.1, momentum=0.9)
loss = F.cross_entropy(clf(X_ALL[:BATCH]), Y_ALL[:BATCH])
clf_opt.zero_grad()
loss.backward()
clf_opt.step()

minimal_path = RUN_DIR / "minimal.tar"
torch.save(
    {
        "epoch": 0,
        "model_state_dict": clf.state_dict(),
        "optimizer_state_dict": clf_opt.state_dict(),
        "loss": loss.item(),
    },
    minimal_path,
)

clf2 = Classifier()
clf2_opt = torch.optim.SGD(clf2.parameters(), lr=0.1, momentum=0.9)
checkpoint = torch.load(minimal_path)
clf2.load_state_dict(checkpoint["model_state_dict"])
clf2_opt.load_state_dict(checkpoint["optimizer_state_dict"])
epoch, last_loss = checkpoint["epoch"], checkpoint["loss"]
clf2.train()  # or .eval() to evaluate
print("keys:", sorted(checkpoint), "| epoch", epoch, "| loss", f"{last_loss:.2f}")
assert torch.equal(
    clf2_opt.state_dict()["state"][0]["momentum_buffer"], clf_opt.state_dict()["state"][0]["momentum_buffer"]
)

# %% [markdown]
# ### 5.1 What the minimal recipe misses
#
# Resuming gives *exactly* the run you would have had only if every piece of state that influences the next steps
# comes back:
#
# | state | why it matters |
# |---|---|
# | model `state_dict` | weights and BatchNorm statistics |
# | optimizer `state_dict` | momentum / Adam moments; without them the next steps are different |
# | LR scheduler `state_dict` | where in the schedule you are |
# | `GradScaler` `state_dict` | the current loss scale of mixed precision (notebook 07) |
# | epoch **and step** | where to continue, also in the middle of an epoch |
# | random states: Python, NumPy, torch CPU and GPU (CUDA or MPS) | dropout masks, random augmentation, sampling |
# | position in the data | which batch comes next |
#
# The last row is solved here by design rather than by saving: derive each epoch's shuffle from a generator
# seeded with the epoch number, so that any step's batch can be recomputed (section 5.4 does it, and so does
# exercise 3). Large jobs whose data loaders keep more state (worker processes, streaming data) save the loader
# itself; the `torchdata` package's `StatefulDataLoader` has a `state_dict()` for that.
#
# ### 5.2 Random states that load with `weights_only=True`
#
# Each source of randomness has its own global **random number generator** (随机数生成器), and each can hand out
# its **state** (状态) and take it back:
#
# | generator | read | restore | what the state is |
# |---|---|---|---|
# | Python's `random` | `random.getstate()` | `random.setstate(s)` | a version number, a tuple of 625 ints, `None` |
# | NumPy's global one | `np.random.get_state()` | `np.random.set_state(s)` | a name, an array of 624 `uint32`, three numbers |
# | torch, CPU | `torch.get_rng_state()` | `torch.set_rng_state(t)` | a `uint8` tensor |
# | torch, CUDA | `torch.cuda.get_rng_state_all()` | `torch.cuda.set_rng_state_all(ts)` | one `uint8` tensor per GPU |
# | torch, Apple's MPS | `torch.mps.get_rng_state()` | `torch.mps.set_rng_state(t)` | a `uint8` tensor |
#
# Tensors, numbers, strings, `None`, tuples, lists and dictionaries load with `weights_only=True`. A NumPy array
# does not: pickling it refers to NumPy's own functions, which are not on the allow-list. So NumPy's state is
# stored as a tensor and plain numbers, and turned back into an array on loading. The tensor is `int64`, which
# holds every `uint32` value (torch's own `uint32` tensors support few operations). First the failure, then the
# recipe: save all the states, draw from every generator, load the file with `weights_only=True`, restore, and
# draw the same numbers again.


# %%
def capture_rng_states() -> dict:
    """Every global generator's state, as tensors and plain Python values only."""
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    states = {
        "python": random.getstate(),  # already plain: (3, a tuple of 625 ints, None)
        "numpy": {
            "kind": str(kind),  # "MT19937"
            "keys": torch.from_numpy(keys.astype(np.int64)),  # the array, as a tensor
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()  # one state per GPU
    if torch.backends.mps.is_available():
        states["mps"] = torch.mps.get_rng_state()  # Apple GPUs have their own generator too
    return states


def restore_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np_state = states["numpy"]
    np_keys = np_state["keys"].numpy().astype(np.uint32)
    np.random.set_state(
        (np_state["kind"], np_keys, np_state["pos"], np_state["has_gauss"], np_state["cached_gaussian"])
    )
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    if "mps" in states and torch.backends.mps.is_available():
        torch.mps.set_rng_state(states["mps"])


def draw() -> list[float]:
    """One number from each generator (and a dropout mask would come from torch's)."""
    return [round(random.random(), 4), round(float(np.random.rand()), 4), round(torch.rand(1).item(), 4)]


raw_path = RUN_DIR / "numpy_array_state.pt"
torch.save({"numpy": np.random.get_state()}, raw_path)
print("a NumPy state saved as it is needs:", torch.serialization.get_unsafe_globals_in_checkpoint(raw_path))
try:
    torch.load(raw_path, weights_only=True)
    refused = False
except pickle.UnpicklingError:
    refused = True
print("torch.load(..., weights_only=True) refuses it:", refused)

seed_everything(6)
rng_path = RUN_DIR / "rng_states.pt"
torch.save(capture_rng_states(), rng_path)
print(
    "saved:",
    sorted(torch.load(rng_path, weights_only=True)),
    "| needs nothing else:",
    torch.serialization.get_unsafe_globals_in_checkpoint(rng_path),
)
after_save = draw()
print("python, numpy, torch draw after saving:     ", after_save)
for _ in range(3):
    draw()  # training goes on, then the process dies
restore_rng_states(torch.load(rng_path, weights_only=True))
after_restore = draw()
print("and after loading the file and restoring:   ", after_restore)
assert refused and after_restore == after_save
assert torch.serialization.get_unsafe_globals_in_checkpoint(rng_path) == []

# %% [markdown]
# The course's `utils.checkpoint_files` keeps these two functions as `rng_state_dict()` and
# `load_rng_state_dict(states)` (with checks of the input added, and all generators restored or none), because
# notebooks 07 and 08 save checkpoints too. The assert below checks that they capture exactly what
# `capture_rng_states` captures, and restore the same numbers.

# %%
needs("capture_rng_states", "rng_path", "after_save", run="the cell above (section 5.2)")
ours, helpers = capture_rng_states(), rng_state_dict()
assert sorted(ours) == sorted(helpers) and ours["python"] == helpers["python"]
assert torch.equal(ours["torch"], helpers["torch"])
assert all(torch.equal(a, b) for a, b in zip(ours.get("cuda", []), helpers.get("cuda", [])))
assert torch.equal(ours.get("mps", torch.zeros(0)), helpers.get("mps", torch.zeros(0)))
for key, value in ours["numpy"].items():
    same = torch.equal(value, helpers["numpy"][key]) if torch.is_tensor(value) else value == helpers["numpy"][key]
    assert same, key
load_rng_state_dict(torch.load(rng_path, weights_only=True))
with_helper = draw()
print("rng_state_dict() holds", sorted(helpers), "| after load_rng_state_dict the draws are", with_helper)
assert with_helper == after_save

# %% [markdown]
# ### 5.3 Saving so that a crash cannot tear the file
#
# A plain `torch.save(ckpt, "checkpoint.pt")` writes the file in place: if the process dies halfway (out of
# memory, a cluster job killed at its time limit, a power cut) the file under the final name is truncated and
# the previous good checkpoint has already been overwritten. The classic recipe is an **atomic save** (原子保存):
#
# 1. write to a temporary file **in the same folder** (a rename is only atomic within one file system);
# 2. `flush()` (Python's buffer to the OS) and `os.fsync()` (the OS cache to the disk);
# 3. `os.replace(tmp, final)`: one rename, so readers see the old file or the new one, never half;
# 4. `fsync` the folder, so that the rename itself survives a power cut.
#
# Step 3 is atomic for a `rename` on a **local POSIX file system** (Linux, macOS). On Windows, `os.replace`
# calls `MoveFileEx(..., MOVEFILE_REPLACE_EXISTING)`, which Microsoft does not document as atomic, and a folder
# cannot be opened to `fsync` it. Network and user-space file systems (NFS, SMB, FUSE mounts, cloud buckets) may
# give none of these guarantees and may reject `fsync` on a folder.
#
# *(Optional detail, this paragraph.)* One detail is easy to miss. The obvious tool for step 1,
# `tempfile.mkstemp`, creates its file readable by its owner only (mode `0o600`, `-rw-------`), and the rename keeps that mode, so the checkpoint becomes private: on
# a shared machine your teammates' jobs cannot read it. `open()` and a plain `torch.save` instead create files
# with mode `0o666` minus the **umask** (权限掩码), the process's mask of permission bits to remove: usually
# `0o022`, which gives `-rw-r--r--`. So the function creates its temporary file itself, with `os.open(path,
# os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)`: the mode `0o666` minus the umask, as `open()` gives, and
# `O_EXCL` refuses a name that already exists (the name is random, so a clash only means trying again). Fixing
# the mode afterwards with `os.chmod` would need the umask's value, and Python reads the umask only by setting
# it (`os.umask(0)`, then back): for that moment, any other thread of the process creates files with no mask at
# all.
#
# Below, `mock.patch.object(torch, "save", ...)` replaces `torch.save` inside its `with` block only, here
# by a failure like a full disk.


# %%
def create_temp_file(folder: str) -> tuple[int, str]:
    """A new file with a random name in `folder`, with the mode open() gives (0o666 minus the umask)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)  # O_BINARY: Windows only
    while True:
        tmp_path = os.path.join(folder, f".tmp-{secrets.token_hex(4)}")
        try:
            return os.open(tmp_path, flags, 0o666), tmp_path
        except FileExistsError:  # the random name is taken: draw another
            continue


def atomic_save(obj, final_path) -> None:
    folder = os.path.dirname(os.path.abspath(final_path))
    fd, tmp_path = create_temp_file(folder)  # 1. same folder
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()  # 2. Python's buffer -> OS
            os.fsync(f.fileno())  #    OS cache -> disk
        os.replace(tmp_path, final_path)  # 3. the atomic step
    except BaseException:
        os.unlink(tmp_path)  # a failed save leaves no litter
        raise
    with contextlib.suppress(OSError):  # 4. not possible on Windows and some network file systems
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


by_hand = RUN_DIR / "by_hand.pt"
atomic_save({"step": 1, "w": torch.arange(3.0)}, by_hand)
with mock.patch.object(torch, "save", side_effect=OSError(28, "No space left on device (simulated)")):
    with contextlib.suppress(OSError):
        atomic_save({"step": 2, "w": torch.zeros(3)}, by_hand)  # fails before the rename
kept = torch.load(by_hand)
print(
    "after a failed second save the file still holds step",
    kept["step"],
    "| files:",
    sorted(p.name for p in RUN_DIR.iterdir() if p.name.startswith((".tmp-", "by_hand"))),
)
assert kept["step"] == 1 and not any(p.name.startswith(".tmp-") for p in RUN_DIR.iterdir())

# %% [markdown]
# The course's helper `utils.checkpoint_files.atomic_torch_save(obj, path)` takes the same four steps (its
# temporary file, too, is made with `os.open(..., 0o666)`, and locked while it is written) and adds a checksum
# (section 6.2). With the usual umask, set explicitly for the comparison, every way of saving gives the same
# permissions except a bare `mkstemp`:

# %%
needs("atomic_save", run="the cell above (section 5.3)")
saved_modes = {}
old_mask = os.umask(0o022)  # the usual umask, so that every machine prints the same modes
try:
    torch.save({"w": torch.zeros(1)}, RUN_DIR / "plain.pt")
    atomic_save({"w": torch.zeros(1)}, RUN_DIR / "by_hand_022.pt")
    atomic_torch_save({"w": torch.zeros(1)}, RUN_DIR / "helper_022.pt")
    fd, bare_tmp = tempfile.mkstemp(dir=RUN_DIR)
    os.close(fd)
finally:
    os.umask(old_mask)
for label, path in [
    ("plain torch.save", RUN_DIR / "plain.pt"),
    ("atomic_save (by hand)", RUN_DIR / "by_hand_022.pt"),
    ("atomic_torch_save (helper)", RUN_DIR / "helper_022.pt"),
    ("tempfile.mkstemp alone", bare_tmp),
]:
    saved_modes[label] = stat.S_IMODE(os.stat(path).st_mode)
    print(f"{label:<27} {stat.filemode(os.stat(path).st_mode)}  ({oct(saved_modes[label])})")
os.unlink(bare_tmp)
assert (
    saved_modes["plain torch.save"] == saved_modes["atomic_save (by hand)"] == saved_modes["atomic_torch_save (helper)"]
)
if os.name == "posix":
    assert saved_modes["plain torch.save"] == 0o644 and saved_modes["tempfile.mkstemp alone"] == 0o600

# %% [markdown]
# ### 5.4 Resuming bit for bit
#
# `utils/checkpoint_files.py` packs the whole table of section 5.1 around `atomic_torch_save`:
# `save_checkpoint(folder, model=, optimizer=, scheduler=, scaler=, epoch=, step=, extra=, keep_last=)` writes
# `checkpoint_<step>.pt` atomically with the random states of section 5.2, then deletes all but the newest
# `keep_last` files, and `load_checkpoint(folder_or_file, model=, ...)` restores everything. Its files hold only
# tensors and plain values, so it loads them with `weights_only=True`. (Notebook 07 uses it to save a
# `GradScaler`, and the multi-process scripts of notebook 08 save with `atomic_torch_save`.) First, 24 steps
# without interruption, as the reference. Each step's batch comes from `batch_at(step)`, whose shuffle depends
# only on the epoch: the "position in the data" row of the table, solved by design.


# %%
needs("Classifier", "X_ALL", run="the first cell of section 5")


def batch_at(step: int):
    """The batch of a global step: the shuffle depends only on the epoch, never on earlier draws."""
    epoch, i = divmod(step, STEPS_PER_EPOCH)
    order = torch.randperm(len(X_ALL), generator=torch.Generator().manual_seed(1000 + epoch))
    idx = order[i * BATCH : (i + 1) * BATCH]
    return X_ALL[idx].to(device), Y_ALL[idx].to(device)


def make_run(seed: int = 0):
    torch.manual_seed(seed)
    model = Classifier().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # halves the LR every epoch
    scaler = torch.amp.GradScaler(device.type)  # mixed precision comes in notebook 07; here only its state
    return model, opt, sched, scaler


class SimulatedCrash(Exception):
    pass


def train(run, start: int, stop: int, *, ckpt_dir=None, save_every: int = 4, crash_at: int | None = None):
    model, opt, sched, scaler = run
    model.train()
    for step in range(start, stop):
        if step == crash_at:
            raise SimulatedCrash(f"the process dies before step {step}")
        x, y = batch_at(step)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if (step + 1) % STEPS_PER_EPOCH == 0:
            sched.step()
        if ckpt_dir is not None and (step + 1) % save_every == 0:
            save_checkpoint(
                ckpt_dir,
                model=model,
                optimizer=opt,
                scheduler=sched,
                scaler=scaler,
                epoch=(step + 1) // STEPS_PER_EPOCH,
                step=step + 1,
                extra={"loss": loss.item()},
                keep_last=2,
            )
    return loss.item()


TOTAL = EPOCHS * STEPS_PER_EPOCH
reference = make_run()
final_loss = train(reference, 0, TOTAL)
print(f"reference run: {TOTAL} steps, final loss {final_loss:.2f}")
assert final_loss < 0.5

# %% [markdown]
# Now the same run, saving every 4 steps and keeping the last 2 files, dies before step 14. Then a
# "new process" builds fresh objects (with another seed and scrambled random states, as a restart
# would have) and resumes from the newest checkpoint: step 12, in the middle of epoch 1.

# %%
needs("make_run", "reference", run="the first cell of section 5.4")
ckpt_dir = RUN_DIR / "resume"
run = make_run()
try:
    train(run, 0, TOTAL, ckpt_dir=ckpt_dir, crash_at=14)
except SimulatedCrash as err:
    print("crash:", err)
del run
print("checkpoints on disk:", [p.name for p in list_checkpoints(ckpt_dir)])

resumed = make_run(seed=123)
torch.manual_seed(999)
model, opt, sched, scaler = resumed
info = load_checkpoint(ckpt_dir, model=model, optimizer=opt, scheduler=sched, scaler=scaler)
print(f"loaded {info.path.name}: epoch {info.epoch}, step {info.step}, lr {sched.get_last_lr()[0]:.3f}")
train(resumed, info.step, TOTAL, ckpt_dir=ckpt_dir)  # and keeps saving
print("checkpoints on disk now:", [p.name for p in list_checkpoints(ckpt_dir)])

identical = all(torch.equal(a, b) for a, b in zip(reference[0].state_dict().values(), model.state_dict().values()))
largest = max((a - b).abs().max().item() for a, b in zip(reference[0].parameters(), model.parameters()))
print("largest weight difference from the reference:", largest, "| bit-identical:", identical)
if device.type == "cpu":
    assert identical
else:  # GPU kernels may reorder sums unless deterministic algorithms are enforced (notebook 12, section 2)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(reference[0].parameters(), model.parameters()))

# %% [markdown]
# Is every piece really needed? Two controls resume from the same kind of file (the resumed run kept
# saving; `keep_last=2` left steps 20 and 24) but each drops one piece: without the random states the
# dropout masks differ; with a fresh optimizer the momentum is lost. Both end somewhere else.


# %%
needs("ckpt_dir", run="the cells of section 5.4")


def resume_variant(*, restore_rng: bool, with_optimizer: bool) -> float:
    variant = make_run(seed=123)
    torch.manual_seed(999)
    m, o, s, sc = variant
    start = load_checkpoint(
        ckpt_dir / "checkpoint_00000020.pt",
        model=m,
        optimizer=o if with_optimizer else None,
        scheduler=s,
        scaler=sc,
        restore_rng=restore_rng,
    ).step
    train(variant, start, TOTAL)
    return max((a - b).abs().max().item() for a, b in zip(reference[0].parameters(), m.parameters()))


no_rng = resume_variant(restore_rng=False, with_optimizer=True)
no_opt = resume_variant(restore_rng=True, with_optimizer=False)
print(f"largest weight difference from the reference without the RNG states:      {no_rng:.3f}")
print(f"largest weight difference from the reference without the optimizer state: {no_opt:.3f}")
assert no_rng > 1e-4 and no_opt > 1e-4

# %% [markdown]
# ## 6. Crash-proof saving and loading
#
# `save_checkpoint` writes with the four steps of section 5.3, and only then deletes checkpoints older than the
# last `keep_last`. `load_checkpoint` checks the file before loading it (how, in section 6.2) and turns any failure
# into a `CheckpointError` naming the file. This section breaks files in every way we can think of and shows what
# survives.
#
# ### 6.1 A torn file, and `fallback=True`
#
# Here is what a plain in-place save leaves when it dies mid-write (we write half of a real file under the next
# name), and how `fallback=True` recovers by loading the newest file that is intact:

# %%
needs("ckpt_dir", run="the cells of section 5.4")
good = list_checkpoints(ckpt_dir)[-1]
torn = ckpt_dir / "checkpoint_00000028.pt"
torn.write_bytes(good.read_bytes()[: good.stat().st_size // 2])  # what an interrupted in-place write leaves
try:
    load_checkpoint(ckpt_dir, model=Classifier())
except CheckpointError as err:
    print(type(err).__name__, "(a ValueError):", short(err))
info = load_checkpoint(ckpt_dir, model=Classifier(), fallback=True)
print("fallback=True loaded", info.path.name, "| skipped", [p.name for p, _ in info.skipped])
assert info.path == good and info.skipped[0][0] == torn
torn.unlink()

# %% [markdown]
# ### 6.2 A flipped bit: a checksum at the end of the file
#
# Truncation is the easy case. A flipped bit inside a tensor's bytes (a bad disk, a broken copy) is
# worse: `torch.load` does not verify the CRC-32 checksums that the zip format stores for each record,
# so it returns a silently different weight. `save_checkpoint` therefore ends the file with the
# SHA-256 of all its other bytes, stored as the zip's *comment* (a free field at the very end of a zip
# file: zip readers report it apart from the archived files, as `zipfile` does below, and `torch.load`
# ignores it), and `load_checkpoint` compares it before loading:

# %%
needs("Classifier", run="the first cell of section 5")
flip_dir = RUN_DIR / "bitflip"
flip_model = Classifier()
flip_path = save_checkpoint(flip_dir, model=flip_model, step=1)
data = bytearray(flip_path.read_bytes())
where = data.find(flip_model.net[0].weight.detach().cpu().numpy().tobytes())
data[where + 2] ^= 0x40  # one bit in the third byte of the first weight
flip_path.write_bytes(bytes(data))

silently = torch.load(flip_path, weights_only=True)["model"]["net.0.weight"]
print(
    "torch.load: loads without complaint; first weight changed:",
    not torch.equal(silently, flip_model.net[0].weight.detach().cpu()),
)
with zipfile.ZipFile(flip_path) as zf:
    comment = zf.comment
print("the zip's comment:", comment[:20].decode(), "+", len(comment) - 20, "hex digits")
assert comment.startswith(b"torch-course-sha256:") and len(comment) == 20 + 64
try:
    load_checkpoint(flip_path, model=Classifier())
    caught = False
except CheckpointError as err:
    caught = True
    print("load_checkpoint:", short(err))
assert where > 0 and caught and not torch.equal(silently, flip_model.net[0].weight.detach().cpu())

# %% [markdown]
# ### 6.3 Rolling back, and several processes
#
# Two more situations where "the newest file" is the wrong answer:
#
# * **Rolling back.** The loss blew up after step 24, so you resume from step 24 on purpose and go on
#   (say with a smaller learning rate), saving step 25. The stale step-28 file of the abandoned run
#   would still carry the largest number, and the next automatic resume after a crash would pick it.
#   So saving step *N* first moves every checkpoint numbered above *N* into the sub-folder
#   `superseded/` (moved, not deleted: you may still want to look at it).
# * **Several processes.** In DDP every rank has its own random generators (notebook 08), but only
#   rank 0 writes the file. A checkpoint stores the states under the rank that saved them, and
#   `load_checkpoint` on any other rank refuses with a `ValueError` instead of silently giving rank 3
#   the dropout masks of rank 0. Either gather every rank's `rng_state_dict()` (section 5.2) and pass
#   `rng_states={rank: state}` to `save_checkpoint`, or resume with `restore_rng=False`. Here `rank=`
#   is passed explicitly, as a process of a process group would find it.

# %%
needs("model", run="the cells of section 5.4")
rollback_dir = RUN_DIR / "rollback"
for step in (20, 24, 28):
    save_checkpoint(rollback_dir, model=model, step=step)
load_checkpoint(rollback_dir / "checkpoint_00000024.pt", model=model)  # go back to step 24
save_checkpoint(rollback_dir, model=model, step=25)  # the first save of the new timeline
print(
    "checkpoints:",
    [p.name for p in list_checkpoints(rollback_dir)],
    "| superseded/:",
    [p.name for p in list_checkpoints(rollback_dir / "superseded")],
)
assert list_checkpoints(rollback_dir)[-1].name == "checkpoint_00000025.pt"

try:
    load_checkpoint(rollback_dir, model=model, rank=1)
    refused = False
except ValueError as err:
    refused = True
    print("on rank 1 ->", type(err).__name__, ":", short(err).split(":")[0])
info = load_checkpoint(rollback_dir, model=model, rank=1, restore_rng=False)
print("rank 1 with restore_rng=False loads step", info.step)
assert refused and info.step == 25

# %% [markdown]
# ### 6.4 A full disk, and a killed process
#
# An exception in the middle of `save_checkpoint` (here `torch.save` is patched to write half the bytes
# and then fail, like a full disk) leaves the older checkpoints untouched and no temporary file, and a
# full disk is reported as one, naming the file:

# %%
needs("ckpt_dir", "TOTAL", run="the cells of section 5.4")
real_save = torch.save


def half_then_disk_full(obj, f, *args, **kwargs):
    buffer = io.BytesIO()
    real_save(obj, buffer, *args, **kwargs)
    f.write(buffer.getvalue()[: buffer.getbuffer().nbytes // 2])
    raise OSError(28, "No space left on device (simulated)")


before = sorted(p.name for p in ckpt_dir.iterdir())
with mock.patch.object(torch, "save", half_then_disk_full):
    try:
        save_checkpoint(ckpt_dir, model=model, optimizer=opt, step=TOTAL + 4, keep_last=2)
    except OSError as err:
        disk_full = err
        print("save failed:", short(err))
after = sorted(p.name for p in ckpt_dir.iterdir())
print("files before:", before)
print("files after: ", after)
print("newest still loads: step", load_checkpoint(ckpt_dir, model=Classifier()).step)
assert before == after and disk_full.errno == 28 and "no space left" in str(disk_full)

# %% [markdown]
# An exception still runs `except`/`finally` blocks. A process killed with `SIGKILL` (what the
# kernel's out-of-memory killer or a scheduler does) runs nothing at all. So we start a real child
# Python process that saves step 1, then dies by `SIGKILL` halfway through writing step 2; then we look
# at what it left, and at what the next save does with it while another save (simulated) is running:

# %%
CHILD = r"""
import io, os, signal, sys
import torch
from torch import nn
from utils.checkpoint_files import save_checkpoint

folder = sys.argv[1]
torch.manual_seed(0)
model = nn.Linear(4, 2)
save_checkpoint(folder, model=model, step=1)
real_save = torch.save

def dies_halfway(obj, f, *args, **kwargs):
    buffer = io.BytesIO()
    real_save(obj, buffer, *args, **kwargs)
    f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)  # nothing after this line runs, no finally block either

torch.save = dies_halfway
save_checkpoint(folder, model=model, step=2)
print("never printed")
"""
killed_dir = RUN_DIR / "killed"


def listing(folder) -> list[str]:
    """The file names in folder, with the random part of temporary names replaced."""
    return sorted(re.sub(r"\.pt\.\w+\.tmp$", ".pt.<random>.tmp", p.name) for p in folder.iterdir())


if hasattr(signal, "SIGKILL"):
    print("starting the child process (it imports torch, which takes a few seconds)...")
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(killed_dir)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    print("child exit code:", child.returncode, "(killed by signal", -child.returncode, "= SIGKILL)")
    print("folder after the kill:", listing(killed_dir))
    info = load_checkpoint(killed_dir, model=nn.Linear(4, 2))
    print("load_checkpoint ignores the temporary file and loads step", info.step)
    assert child.returncode == -signal.SIGKILL and "never printed" not in child.stdout and info.step == 1

    import fcntl  # POSIX only, like SIGKILL

    running = killed_dir / ".checkpoint_00000003.pt.0a1b2c3d.tmp"  # another process's save, still writing
    with open(running, "wb") as writer:
        fcntl.flock(writer, fcntl.LOCK_EX)  # what a save holds on its temporary file until the rename
        save_checkpoint(killed_dir, model=nn.Linear(4, 2), step=2)  # the restarted job saves again
        after_save = listing(killed_dir)
    print("after the next save:", after_save)
    assert after_save == [".checkpoint_00000003.pt.<random>.tmp", "checkpoint_00000001.pt", "checkpoint_00000002.pt"]
    running.unlink()
else:  # Windows has no SIGKILL
    print("child exit code: -9 on Linux/macOS; this platform has no SIGKILL, so the demonstration is skipped")

# %% [markdown]
# The hidden `.tmp` file is what a hard kill leaves behind; the final name never holds half a file. No
# loader looks at the temporary file, and the next save into the folder deletes it. How does it know
# that the writer is dead, and not a concurrent save still writing? A save holds a lock
# (`fcntl.flock`) on its temporary file until the rename, and the kernel releases that lock when the
# file is closed, which happens to every file of a process that dies, however it dies: a temporary file
# that nobody locks is abandoned, a locked one (above, `.checkpoint_00000003.pt.0a1b2c3d.tmp`, the save of step 3
# that another process is still writing) is left alone.
#
# ## 7. Several models in one file, warm starts and renamed keys
#
# An encoder–decoder (or a GAN's generator and discriminator) is saved like a checkpoint: one
# dictionary with one `state_dict` per model and per optimizer. With `save_checkpoint` you can
# instead group the models in an `nn.ModuleDict`, whose `state_dict` prefixes each key with the
# model's name.

# %%
encoder, decoder = nn.Linear(10, 4), nn.Linear(4, 10)
enc_opt = torch.optim.Adam(encoder.parameters())
dec_opt = torch.optim.Adam(decoder.parameters())
pair_path = RUN_DIR / "encoder_decoder.tar"
torch.save(
    {
        "encoder": encoder.state_dict(),
        "decoder": decoder.state_dict(),
        "encoder_opt": enc_opt.state_dict(),
        "decoder_opt": dec_opt.state_dict(),
    },
    pair_path,
)
both = torch.load(pair_path)
encoder2, decoder2 = nn.Linear(10, 4), nn.Linear(4, 10)
encoder2.load_state_dict(both["encoder"])
decoder2.load_state_dict(both["decoder"])
print("one file, keys:", sorted(both))

autoencoder = nn.ModuleDict({"encoder": encoder, "decoder": decoder})
path = save_checkpoint(RUN_DIR / "autoencoder", model=autoencoder, step=0)
print("ModuleDict keys in", path.name, ":", list(torch.load(path)["model"]))
assert torch.equal(encoder2.weight, encoder.weight) and torch.equal(decoder2.bias, decoder.bias)

# %% [markdown]
# ### 7.1 Warm-starting a different model
#
# *Warm-starting* reuses weights of a model trained for another task: same backbone, new head.
# `load_state_dict(sd, strict=False)` tolerates *missing* and *unexpected* keys and returns them so you
# can check them, but it does **not** tolerate a key whose shape changed: the 2-class head cannot go
# into a 5-class head. Keep only the entries whose shapes fit, then read the report. The models are built as
# `nn.Sequential(OrderedDict(features=..., head=...))`: given an ordered dictionary, `nn.Sequential` names each
# child by its key instead of `0`, `1`, ..., so the keys read `features.0.weight` and `head.weight`.


# %%
def classifier(num_classes: int) -> nn.Sequential:
    return nn.Sequential(
        OrderedDict(features=nn.Sequential(nn.Linear(10, 32), nn.ReLU()), head=nn.Linear(32, num_classes))
    )


pretrained = classifier(2).state_dict()
new_model = classifier(5)
refused = False
try:
    new_model.load_state_dict(pretrained, strict=False)
except RuntimeError as err:
    refused = True
    print(
        "strict=False with a changed shape ->",
        type(err).__name__,
        ":",
        next(line.strip() for line in str(err).splitlines() if "size mismatch" in line),
    )

target = new_model.state_dict()
fitting = {k: v for k, v in pretrained.items() if k in target and v.shape == target[k].shape}
report = new_model.load_state_dict(fitting, strict=False)
print("missing keys:", report.missing_keys, "| unexpected keys:", report.unexpected_keys)
assert refused and report.missing_keys == ["head.weight", "head.bias"]
assert torch.equal(new_model.features[0].weight, pretrained["features.0.weight"])

# %% [markdown]
# ### 7.2 Renamed layers
#
# When a layer was **renamed** (say the old code called the backbone `backbone`), edit the loaded dictionary so
# that its keys fit the new model: a `state_dict` is an ordinary dictionary, and its keys are only strings.
# Replace the prefix only at the *start* of a key (`str.removeprefix`), never anywhere inside it (section 8.2
# shows what goes wrong otherwise).

# %%
needs("pretrained", "classifier", run="the cell of section 7.1")
old_style = {k.replace("features.", "backbone.", 1): v for k, v in pretrained.items()}
print("old checkpoint keys:", list(old_style))
renamed = {
    ("features." + k.removeprefix("backbone.") if k.startswith("backbone.") else k): v for k, v in old_style.items()
}
fresh = classifier(2)
print("after renaming:", fresh.load_state_dict(renamed))
assert torch.equal(fresh.head.bias, pretrained["head.bias"])

# %% [markdown]
# ## 8. Across devices: `map_location`
#
# Every storage in the file carries a tag naming the device it was saved from (`'cpu'`, `'cuda:1'`,
# ...). By default `torch.load` recreates each tensor on that device, which fails on a machine without
# that GPU. `map_location` redirects them:
#
# * GPU → CPU: `map_location="cpu"` (or `torch.device("cpu")`);
# * CPU → GPU: `map_location="cuda:0"` (any device string), or load on the CPU and call `model.to(device)`;
# * GPU → another GPU: a dictionary from saved tag to new device, `map_location={"cuda:1": "cuda:0"}`.
#
# `map_location` may also be a function. PyTorch first rebuilds each storage on the CPU, then calls
# `map_location(storage, location)` with the saved tag as `location`, and uses what it returns. Older code
# writes `lambda storage, loc: storage` (keep it on the CPU: the same as `"cpu"`) and
# `lambda storage, loc: storage.cuda(1)` (move every storage to GPU 1: the same as `"cuda:1"`, which says it
# more plainly).
#
# Mind the difference between modules and tensors: `model.to(device)` moves a module in place (and returns it),
# but a tensor's `.to(device)` returns a new tensor (or the tensor itself if it is already there) and leaves the
# original where it was, so write `x = x.to(device)`.
#
# We cannot count on a second GPU, so we *forge* a file that says `cuda:1` (we patch the function that writes the
# device tag) to see the error that a user without that GPU gets, and the fixes. `load_checkpoint` uses
# `map_location="cpu"` by default: `load_state_dict` then copies the values onto whatever device the model is on,
# and in a multi-process job no process piles tensors onto GPU 0 (notebook 08 shows why that matters).

# %%
forged = RUN_DIR / "from_gpu1.pt"
with mock.patch.object(torch.serialization, "location_tag", lambda storage: "cuda:1"):
    torch.save({"w": torch.arange(3.0)}, forged)

seen = []
torch.load(forged, map_location=lambda storage, location: seen.append(location) or storage)
print("device tag stored in the file:", seen)

try:
    torch.load(forged)
    outcome = "loaded"
except RuntimeError as err:
    outcome = "RuntimeError"
    print("no map_location ->", type(err).__name__, ":", first_line(err)[:75], "...")
assert outcome == ("loaded" if torch.cuda.device_count() >= 2 else "RuntimeError")

for where in ("cpu", torch.device("cpu"), {"cuda:1": "cpu"}, lambda storage, location: storage):
    label = "lambda storage, loc: storage" if callable(where) else repr(where)
    w = torch.load(forged, map_location=where)["w"]
    print(f"map_location={label:<30} -> {w.device.type}, {w.tolist()}")
    assert w.device.type == "cpu"

# %%
needs("weights_path", run="the cell of section 2")
if device.type == "cuda":
    to_gpu0 = torch.load(forged, map_location={"cuda:1": "cuda:0"})["w"]
    print("map_location={'cuda:1': 'cuda:0'} ->", to_gpu0.device)
    cpu_to_gpu = torch.load(weights_path, map_location="cuda:0")
    print("CPU checkpoint with map_location='cuda:0' ->", cpu_to_gpu["fc1.weight"].device)
    by_function = torch.load(weights_path, map_location=lambda storage, loc: storage.cuda(0))
    print("map_location=lambda storage, loc: storage.cuda(0) ->", by_function["fc1.weight"].device)
    assert to_gpu0.device.index == 0 and cpu_to_gpu["fc1.weight"].is_cuda
    assert by_function["fc1.weight"].device == cpu_to_gpu["fc1.weight"].device
else:
    print(
        "no CUDA here: on a GPU machine map_location={'cuda:1': 'cuda:0'} puts the tensors on cuda:0, "
        "and map_location='cuda:0' (or lambda storage, loc: storage.cuda(0)) moves a CPU checkpoint onto the GPU"
    )

# shown with a dtype change (it works the same for devices):
# tensor.to(...) returns a new tensor, module.to(...) converts the module in place
t = torch.zeros(2)
t.to(torch.float64)
layer = nn.Linear(2, 2)
returned = layer.to(torch.float64)
print(
    "tensor after t.to(float64):",
    t.dtype,
    "| module after layer.to(float64):",
    layer.weight.dtype,
    "| returned the same module:",
    returned is layer,
)
assert t.dtype == torch.float32 and layer.weight.dtype == torch.float64 and returned is layer

# %% [markdown]
# ### 8.1 Large models: `mmap=True` and the `meta` device
#
# A plain `torch.load` reads every tensor's bytes into freshly allocated memory, and building the model
# first allocates (and randomly initialises) a second copy of every parameter: a 10 GB model briefly
# needs 20 GB. Two switches avoid both copies.
#
# `torch.load(path, mmap=True)` (given a path, not an open file) **maps** the file into memory
# (内存映射) instead of reading it: the returned tensors are slices of one mapping of the whole file,
# each starting at its record's byte offset, and the operating system reads a page from disk only
# when it is first touched (lazily). The
# mapping is private by default (`MAP_PRIVATE`): an in-place change makes a private copy of the page
# and never writes to the file. The proof below: for every tensor, its address minus its byte offset in
# the file is the same number, the address where the file's first byte is mapped.

# %%
seed_everything(0)
big = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
big_path = RUN_DIR / "big.pt"
torch.save(big.state_dict(), big_path)

mapped = torch.load(big_path, mmap=True)
file_bytes = big_path.read_bytes()
offsets = {name: file_bytes.find(t.numpy().tobytes()) for name, t in mapped.items()}
file_start = {t.untyped_storage().data_ptr() - offsets[name] for name, t in mapped.items()}
print("byte offsets of the tensors in the file:", offsets)
print("address - offset is one number for all", len(mapped), "tensors:", len(file_start) == 1)
assert all(offset > 0 for offset in offsets.values()) and len(file_start) == 1
assert all(torch.equal(mapped[name], value) for name, value in big.state_dict().items())

with torch.no_grad():
    mapped["0.bias"].add_(1.0)  # copy-on-write: changes this process's page only
print("the file is unchanged after an in-place add:", torch.equal(torch.load(big_path)["0.bias"], big[0].bias))
assert torch.equal(torch.load(big_path)["0.bias"], big[0].bias)
mapped = torch.load(big_path, mmap=True)

# %% [markdown]
# A model built under `with torch.device("meta"):`, on the **meta device** (元设备), has parameters with a shape
# and a dtype but **no storage**: nothing is allocated and the random initialisation does nothing.
# Loading into it with the ordinary `load_state_dict` *copies* into those parameters, which is
# impossible on `meta`: PyTorch warns once per parameter that the copy "is a no-op" and the model stays
# empty. With `load_state_dict(sd, assign=True)` the module **takes the loaded tensors themselves** as
# its parameters (wrapped as `nn.Parameter`, keeping the module's `requires_grad`). With `mmap=True`
# they are still views of the file: the model now costs no memory until its pages are used.
#
# Two more tools and a caveat. To put the weights on a device instead (say, straight onto the GPU), call
# `model.to_empty(device=...)` first: it gives every tensor of the meta model real but *uninitialised* storage on
# that device, and an ordinary `load_state_dict` then copies the values in. The caveat: anything not in the file
# (a buffer registered with `persistent=False`) stays on `meta` after `assign=True` (and holds garbage after
# `to_empty`): recreate it yourself. A model too large for one process is sharded across ranks (FSDP) and saved shard by shard
# with `torch.distributed.checkpoint`: [notebook 09](09_sharding_and_distributed_checkpoints.ipynb),
# section 2.

# %%
needs("mapped", "big", run="the cell above (section 8.1)")
with torch.device("meta"):
    skeleton = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
print("built on:", {p.device.type for p in skeleton.parameters()})
assert all(p.is_meta for p in skeleton.parameters())

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    skeleton.load_state_dict(mapped)  # without assign=True
print(
    f"without assign=True: {len(caught)} x {caught[0].category.__name__}:",
    str(caught[0].message).split(", which")[0].split(": ", 1)[1],
    "... is a no-op",
)
assert len(caught) == 4 and all(w.category is UserWarning and "no-op" in str(w.message) for w in caught)
assert all(p.is_meta for p in skeleton.parameters())  # still empty

print("with assign=True:", skeleton.load_state_dict(mapped, assign=True))
print(
    "parameters now on:",
    {p.device.type for p in skeleton.parameters()},
    "| are the mapped tensors themselves:",
    skeleton[0].weight.data_ptr() == mapped["0.weight"].data_ptr(),
)
assert not any(p.is_meta for p in skeleton.parameters())
assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in skeleton.parameters())
assert skeleton[0].weight.data_ptr() == mapped["0.weight"].data_ptr()
x = torch.randn(4, 256)
with torch.no_grad():
    assert torch.equal(skeleton(x), big(x))

with torch.device("meta"):
    shell = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
shell.to_empty(device="cpu")  # real, uninitialised storage
print("to_empty, then a plain load_state_dict:", shell.load_state_dict(mapped))
with torch.no_grad():
    assert torch.equal(shell(x), big(x))

with torch.device("meta"):
    cached = nn.Linear(2, 2)
    cached.register_buffer("cache", torch.zeros(2), persistent=False)  # in no state_dict
cached.load_state_dict(nn.Linear(2, 2).state_dict(), assign=True)
print("after assign=True: weight on", cached.weight.device.type, "| the unsaved buffer on", cached.cache.device.type)
assert cached.cache.is_meta and not cached.weight.is_meta
cached.cache = torch.zeros(2)  # recreate it: assigning to a buffer's name replaces the buffer
assert not cached.cache.is_meta and "cache" not in cached.state_dict()

# %% [markdown]
# ### 8.2 The `module.` prefix of `DataParallel` and DDP
#
# `nn.DataParallel(model)` and `DistributedDataParallel(model)` (notebook 08, which also explains why DDP is
# preferred even on one machine) store your model as their attribute `module`, so their `state_dict` keys start
# with `module.` and do not fit the bare model. Three ways out:
#
# 1. **Wrap first, then load.** Wrap the new model in `nn.DataParallel` too and load through the wrapper: its
#    keys fit the file, and the weights land in your model, which is the wrapper's `.module`. A loading trick
#    only: it does not make you train with `DataParallel`. (On a machine with exactly one GPU, creating the
#    wrapper also moves the model to `cuda:0`.)
# 2. **Strip the prefix.** Older code writes `k[7:]` or `k.replace('module.', '')`; both can break: slicing cuts 7
#    characters even from keys that have no prefix, and `replace` also rewrites `module.` *inside* a name (a
#    sub-module called `submodule`). PyTorch's `torch.nn.modules.utils.consume_prefix_in_state_dict_if_present`
#    strips it only at the start of each key, in place.
# 3. **Never save it.** Save `model.module.state_dict()` in the first place, which is what `save_checkpoint`
#    does.
#
# The same holds for DDP checkpoints, except that wrapping first needs a process group there (notebook 08): for
# them, strip the prefix or never save it.


# %%
class WithSubmodule(nn.Module):
    def __init__(self):
        super().__init__()
        self.submodule = nn.Linear(3, 3)


bare = WithSubmodule()
wrapped = nn.DataParallel(bare)  # on a CPU-only machine it simply calls the module
wrapped_sd = wrapped.state_dict()
print("DataParallel keys:", list(wrapped_sd))
try:
    WithSubmodule().load_state_dict(wrapped_sd)
except RuntimeError as err:
    print("loading into the bare model ->", type(err).__name__, ":", first_line(err))

target = WithSubmodule()
print("1. nn.DataParallel(target).load_state_dict(...) ->", nn.DataParallel(target).load_state_dict(wrapped_sd))
print("   target now holds the saved weights:", torch.equal(target.submodule.weight.cpu(), bare.submodule.weight.cpu()))
assert torch.equal(target.submodule.weight.cpu(), bare.submodule.weight.cpu())
assert target.submodule.weight.device.type == ("cuda" if torch.cuda.device_count() == 1 else "cpu")

replaced = [k.replace("module.", "") for k in wrapped_sd]
sliced = [k[7:] for k in bare.state_dict()]
print("2. k.replace('module.', ''):", replaced)
print("   k[7:] on keys without prefix:", sliced)
assert replaced == ["subweight", "subbias"] and sliced == ["le.weight", "le.bias"]

fixed = OrderedDict(wrapped_sd)
consume_prefix_in_state_dict_if_present(fixed, "module.")
print("   consume_prefix_in_state_dict_if_present:", list(fixed), WithSubmodule().load_state_dict(fixed))
print(
    "3. save_checkpoint stores keys:", list(torch.load(save_checkpoint(RUN_DIR / "dp", model=wrapped, step=0))["model"])
)
assert list(fixed) == list(bare.state_dict())

# %% [markdown]
# ### 8.3 The `_orig_mod.` prefix of `torch.compile`
#
# `torch.compile(model)` (notebook 11 uses it for speed) adds a prefix of its own. It returns an `OptimizedModule` that keeps your
# model as its attribute `_orig_mod`, so its `state_dict` keys start with `_orig_mod.` (and with
# `_orig_mod.module.` for a compiled DDP model). Creating the wrapper compiles nothing: compilation
# happens at the first call, so looking at the keys is cheap. The cures are the same as for `module.`:
# save `compiled._orig_mod.state_dict()`, or strip the prefix with
# `consume_prefix_in_state_dict_if_present`. `utils.checkpoint_files.unwrap_model` removes both wrappers, in
# any nesting, and `save_checkpoint`/`load_checkpoint` use it.

# %%
from torch._dynamo.utils import counters as dynamo_counters  # torch.compile's own statistics

needs("bare", "WithSubmodule", run="the cell of section 8.2")

compiled = torch.compile(bare)  # no call: nothing is compiled
compiled_sd = compiled.state_dict()
print("torch.compile keys:", list(compiled_sd), "| frames compiled so far:", dynamo_counters["frames"]["ok"])
assert dynamo_counters["frames"]["ok"] == 0
assert compiled._orig_mod is bare and list(compiled_sd) == ["_orig_mod.submodule.weight", "_orig_mod.submodule.bias"]

stripped = OrderedDict(compiled_sd)
consume_prefix_in_state_dict_if_present(stripped, "_orig_mod.")
print("after consume_prefix_in_state_dict_if_present:", list(stripped), WithSubmodule().load_state_dict(stripped))
print("unwrap_model(torch.compile(DataParallel(m))) is m:", unwrap_model(torch.compile(nn.DataParallel(bare))) is bare)
saved_keys = list(torch.load(save_checkpoint(RUN_DIR / "compiled", model=compiled, step=0))["model"])
print("save_checkpoint stores keys:", saved_keys)
assert saved_keys == list(bare.state_dict()) and unwrap_model(torch.compile(nn.DataParallel(bare))) is bare

# %% [markdown]
# ### 8.4 Checkpoints from Python 2: `UnicodeDecodeError` and `encoding="latin1"`
#
# *(Optional detail: only for checkpoints written under Python 2.)* Python 2's `str` was a byte string; Python 3's unpickler must turn each one into text. Plain `pickle`
# assumes ASCII, and fails with `UnicodeDecodeError: 'ascii' codec can't decode byte 0xc3` (the error that
# older answers about Python 2 models quote). We can reproduce it with a two-byte Python-2-style pickle (the
# UTF-8 bytes of "é" stored as an old byte string). `encoding="latin1"` maps each byte to one character
# (right for NumPy arrays and raw buffers, mojibake for text), `encoding="bytes"` keeps bytes.
#
# `torch.load` decodes such strings as UTF-8 unless told otherwise, so UTF-8 text in an old file loads; bytes
# that are not UTF-8 still fail, now with `'utf-8' codec can't decode`. `torch.load` accepts `encoding=` itself
# and hands it to the unpickler, so there is no need to patch `pickle` (older advice edits PyTorch's
# `serialization.py` to pass it), and it works with the safe default `weights_only=True` too. PyTorch warns that
# such pickle options work only with `weights_only=False`, but for `encoding` the warning is wrong: the
# weights-only unpickler decodes old byte strings with it. The cell shows it on a forged Python-2-era file: the
# format `torch.save` wrote before PyTorch 1.6 (`_use_new_zipfile_serialization=False` still writes it), with
# one entry turned into an old byte string of two bytes that are not UTF-8. So load an old file with
# `torch.load(path, encoding="latin1")` first and ignore that warning; fall back to `weights_only=False` only for a
# file you trust, if the allow-list refuses something in it. You will only meet this with checkpoints from
# before 2020.

# %%
needs("small", run="the cell of section 2")
py2_pickle = b"\x80\x02U\x02\xc3\xa9q\x00."  # protocol 2, SHORT_BINSTRING of 2 bytes
try:
    pickle.loads(py2_pickle)
except UnicodeDecodeError as err:
    print("pickle.loads ->", type(err).__name__, ":", err)
print(
    "encoding='latin1' ->",
    repr(pickle.loads(py2_pickle, encoding="latin1")),
    "| encoding='bytes' ->",
    pickle.loads(py2_pickle, encoding="bytes"),
)

py2_buffer = io.BytesIO()
torch.save({"note": "ab", "fc2.bias": small.fc2.bias.detach()}, py2_buffer, _use_new_zipfile_serialization=False)
unicode_ab = b"X\x02\x00\x00\x00ab"  # the pickle opcode of the text "ab"
assert py2_buffer.getvalue().count(unicode_ab) == 1
py2_file = py2_buffer.getvalue().replace(unicode_ab, b"U\x02\xff\xfe")  # now 2 old-style bytes, not UTF-8
utf8_refused = False
try:
    torch.load(io.BytesIO(py2_file))
except UnicodeDecodeError as err:
    utf8_refused = True
    print("torch.load ->", type(err).__name__, ":", err)
assert utf8_refused
old_file = show_warning(
    lambda: torch.load(io.BytesIO(py2_file), encoding="latin1"), UserWarning, "only works if `weights_only=False`"
)
print("torch.load(..., encoding='latin1') with weights_only=True despite the warning: note", repr(old_file["note"]))
assert old_file["note"] == "\xff\xfe" and torch.equal(old_file["fc2.bias"], small.fc2.bias)
with warnings.catch_warnings():
    warnings.simplefilter("error")  # no warning with weights_only=False (only for a file you trust)
    trusted_old = torch.load(io.BytesIO(py2_file), weights_only=False, encoding="latin1")
assert trusted_old["note"] == old_file["note"]

# %% [markdown]
# ## 9. Exporting for deployment: from TorchScript to `torch.export`
#
# For **deployment** (部署), running a model without its Python code (in C++, on a server, on a phone),
# you save a *graph* of its operations rather than weights. For years the tool was TorchScript, and many
# tutorials still teach it: `torch.jit.trace(model, example)` runs the model once and records the operations that
# happened; `torch.jit.script(model)` compiles the Python source. In PyTorch 2.14 **all of TorchScript is
# deprecated** (`trace`, `script`, `jit.save`, `jit.load` warn with `FutureWarning`) in favour of `torch.export`,
# so we do not use `torch.jit.script` at all, and call `trace` once, only to see its classic flaw. Its warnings
# are recorded with `warnings.catch_warnings(record=True)`, Python's way to collect warnings into a list
# instead of printing them.
#
# Tracing records *one* path. The `MyDecisionGate` of PyTorch's old TorchScript tutorial returns `x` or `-x`
# depending on the sign of
# `x.sum()`; traced with a positive example, the `if` is evaluated once in Python and disappears from
# the graph: the traced model returns `x` for every input. PyTorch even says so with a `TracerWarning`
# ("Converting a tensor to a Python boolean might cause the trace to be incorrect").


# %%
class MyDecisionGate(nn.Module):
    def forward(self, x):
        return x if x.sum() > 0 else -x


gate = MyDecisionGate()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")  # record every warning, also one that Python would show only once
    traced_gate = torch.jit.trace(gate, torch.ones(3))
deprecation = next(str(w.message) for w in caught if issubclass(w.category, FutureWarning))
tracer_message = next(str(w.message) for w in caught if w.category is torch.jit.TracerWarning)
print("FutureWarning:", deprecation)
print("TracerWarning:", tracer_message.split(". ")[0])
assert "jit.trace" in deprecation and "Python boolean" in tracer_message
print("traced code:", " ".join(traced_gate.code.split()))

negative = -torch.ones(3)
print("eager  gate(-1) =", gate(negative).tolist())
print("traced gate(-1) =", traced_gate(negative).tolist())
assert not torch.equal(traced_gate(negative), gate(negative))

# %% [markdown]
# ### 9.1 `torch.export` and `.pt2` files
#
# **Exporting** (导出) with `torch.export.export(model, example_args, dynamic_shapes=...)` also captures a
# graph, but it
# **refuses** data-dependent Python control flow instead of silently baking in one branch, and it
# records which dimensions may vary: here the batch dimension, declared with `torch.export.Dim`.
# `torch.export.save` writes a `.pt2` file (the graph, serialised, plus the weights) and
# `torch.export.load` reads it back as an `ExportedProgram`; `.module()` turns that into a callable.
# Note what this is: a graph that **Python** reloads and runs with PyTorch's operators, so the
# deployment machine still needs Python and PyTorch, but not your model's source code. Its outputs
# match eager PyTorch (checked with `torch.testing.assert_close`) for batch sizes it never saw.

# %%
seed_everything(0)
deploy = nn.Sequential(nn.Linear(10, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 2)).eval()
batch = torch.export.Dim("batch", min=1, max=1024)
exported = torch.export.export(deploy, (torch.randn(4, 10),), dynamic_shapes=({0: batch},))
pt2_path = RUN_DIR / "deploy.pt2"
torch.export.save(exported, pt2_path)
reloaded = torch.export.load(pt2_path).module()
print("operations in the graph:", [str(node.target) for node in exported.graph.nodes if node.op == "call_function"])
for n in (1, 3, 17):
    x = torch.randn(n, 10)
    with torch.no_grad():
        out = reloaded(x)
        torch.testing.assert_close(out, deploy(x))
    print(f"batch {n:>2}: .pt2 output {tuple(out.shape)} matches eager (assert_close)")

# %% [markdown]
# The decision gate cannot be exported as written: the exporter stops with a
# `GuardOnDataDependentSymNode` error ("could not guard on data-dependent expression"). Its
# verbose diagnostics go to stderr, which we capture. The fix is to put the branch *into* the graph
# with `torch.cond(predicate, true_fn, false_fn, operands)`; then both branches survive the round
# trip through a `.pt2` file.

# %%
needs("gate", run="the first cell of section 9")
captured = io.StringIO()
with contextlib.redirect_stderr(captured):
    try:
        torch.export.export(gate, (torch.ones(3),))
        export_error = None
    except Exception as err:  # noqa: BLE001 - the exporter's error type is what we show
        export_error = err
print("exporting the Python if ->", type(export_error).__name__, ":", first_line(export_error)[:53], "...")
assert export_error is not None and "data-dependent" in str(export_error)


class CondGate(nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: t.clone(), lambda t: -t, (x,))


torch.export.save(torch.export.export(CondGate(), (torch.ones(3),)), RUN_DIR / "gate.pt2")
gate_pt2 = torch.export.load(RUN_DIR / "gate.pt2").module()
for x in (torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, -4.0])):  # sum 6 > 0, sum -1 < 0
    print(f"x = {x.tolist()}: eager {gate(x).tolist()}, exported {gate_pt2(x).tolist()}")
    assert torch.equal(gate_pt2(x), gate(x))
assert torch.equal(gate_pt2(torch.tensor([1.0, 2.0, -4.0])), torch.tensor([-1.0, -2.0, 4.0]))  # the `-x` branch

# %% [markdown]
# ### 9.2 Without Python: AOTInductor and ExecuTorch
#
# To run the exported program with **no Python at all** (a C++ server, an embedded device), compile it
# ahead of time. On servers and desktops that is **AOTInductor**: `torch._inductor.aoti_compile_and_package`
# generates C++ (and Triton kernels on a GPU), builds it into a shared library with the system's C++
# compiler, and packs library and weights into another `.pt2` package. Python can load it with
# `torch._inductor.aoti_load_package`; C++ loads it with `torch::inductor::AOTIModelPackageLoader`
# (from libtorch, PyTorch's C++ library, whose C++ frontend `torch::nn` can also build and train models
# without Python; this course stays in Python). For phones and microcontrollers the route is **ExecuTorch**
# (`.pte` files), a separate project. We show the AOTInductor code rather than run it: it needs a C++ compiler,
# and compiling even this tiny model takes about a minute on one CPU thread.
#
# ```python
# package = torch._inductor.aoti_compile_and_package(exported, package_path=RUN_DIR / "deploy_aoti.pt2")
# compiled_model = torch._inductor.aoti_load_package(package)  # or AOTIModelPackageLoader in C++
# x = torch.randn(5, 10)
# with torch.no_grad():
#     torch.testing.assert_close(compiled_model(x), deploy(x))  # compiled kernels: compare with tolerances
# ```

# %% [markdown]
# ## Exercises (练习)
#
# Three exercises, easiest first: predict, write a function, then a stretch that combines this notebook with
# notebook 04's data loading. Each has a **stub cell** that starts with `# ✏️ Exercise N`: edit it and run it. The
# **check cell** below it then says *correct*, or *not yet* with a hint and the section to re-read, or *not
# attempted yet* while the stub is untouched. This section does not depend on the lesson's cells: after a kernel
# restart, run its first cell and go on. `make progress` (without make, e.g. on Windows: `python tools/course.py
# progress`) lists which exercises of every notebook pass. Files go only into temporary folders that the checks
# create and delete.

# %%
import os
import tempfile

import torch
import torch.nn.functional as F
from torch import nn

from utils.exercises import Checker

ex = Checker("06")

# %% [markdown]
# ### Exercise 1 · Predict what a `state_dict` holds
#
# Sections 1.1, 1.2, 8.2 and 8.3 (buffers, optimizer state, the prefixes of wrappers). For the model below, predict on paper:
#
# * **a**: `len(Tagger().state_dict())`, the number of entries in the model's `state_dict`;
# * **b**: `len(opt.state_dict()["state"])` for `model = Tagger()` and `opt = torch.optim.Adam(model.parameters())`,
#   after one `backward()` and one `opt.step()`;
# * **c**: the key under which `torch.compile(nn.DataParallel(model)).state_dict()` stores `model.head.weight`.
#
# Write them as a list `[a, b, c]` (two ints and a string), then check. Predict before you run anything: the check
# sees only the three values, so typing `len(Tagger().state_dict())` would pass it and teach nothing. Run code
# afterwards, to see why.


# %%
class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.1))
        self.head = nn.Linear(8, 3)
        self.register_buffer("temperature", torch.tensor(1.0))
        self.register_buffer("cache", torch.zeros(3), persistent=False)

    def forward(self, x):
        return self.head(self.body(x)) / self.temperature


print(Tagger())  # the layers; what they save is for you to predict

# %%
# ✏️ Exercise 1: replace ... with [a, b, c], e.g. [1, 2, "x.head.weight"]
answer_1 = ...

# %%
ex.check(1, answer_1)

# %% [markdown]
# ### Exercise 2 · A checkpoint that resumes bit for bit
#
# The minimal checkpoint of section 5 saves the epoch, the model's and the optimizer's `state_dict` and the last
# loss; section 5.1 showed what it misses. Write the pair yourself, with `torch.save` and `torch.load` (default
# `weights_only=True`); helpers for one part, such as section 5.2's `rng_state_dict`, are fine, but not the course's
# `save_checkpoint`/`load_checkpoint`, which choose what the file holds for you:
#
# * `save_state(path, model, optimizer, step)` writes one file at `path` with everything needed to continue (the
#   check reads the file back and looks for the state in it);
# * `load_state(path, model, optimizer)` restores it into the model and optimizer it is given (built afresh, as a
#   new process would) and returns the saved `step`.
#
# The check trains a small network with BatchNorm and dropout (`Dropout`), drawing its batches with
# `torch.randint`; both use torch's global random generator (the CPU one: no GPU is involved). It saves, trains on
# (the run that never stopped), then builds a fresh model and optimizer with other weights and another random state,
# loads from a copy of the file at another path, trains on, and compares: the two runs must end with the same weights, with SGD with momentum and with
# AdamW. To try your functions by hand, write into a `tempfile.TemporaryDirectory()`, as the check does.


# %%
# ✏️ Exercise 2: write the bodies of both functions
def save_state(path: str, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    raise NotImplementedError("your code here")


def load_state(path: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    raise NotImplementedError("your code here")


# %%
ex.check(2, save_state, load_state)

# %% [markdown]
# ### Exercise 3 · Resume in the middle of an epoch (stretch)
#
# The last row of section 5.1's table, "position in the data", with notebook 04's `DataLoader` and samplers. Write
# the training loop `train_steps(model, optimizer, dataset, ckpt_path, stop, save_every=4)` of a job that a cluster
# may kill at any moment and then restart with the same arguments:
#
# * if a file exists at `ckpt_path`, resume from it first; train global steps from there up to `stop`
#   (excluded), and return the step it started from (0 without a file);
# * step `s` trains on one batch of `BATCH = 8` samples of `dataset` (a `TensorDataset` of `(x, y)` whose length is
#   a multiple of 8): every epoch visits each sample once, in a new shuffled order each epoch (drawn at random,
#   without reseeding torch's global generator, which the rest of a program draws from), and a restarted job
#   must see exactly the batches the job that never died would have seen;
# * each step: `loss = F.cross_entropy(model(x), y)`, `optimizer.zero_grad()`, `loss.backward()`,
#   `optimizer.step()`;
# * after every `save_every` steps (after global steps 4, 8, 12, ...), save a checkpoint to `ckpt_path`, atomically
#   (section 5.3): a kill in the middle of the save must leave the previous checkpoint whole.
#
# The check runs the job straight to `stop`, then again but killed after step 14 (its last checkpoint holds step
# 12, in the middle of an epoch), and restarts it with a fresh model and optimizer: the batches and the final
# weights must be those of the uninterrupted run; it also watches how each checkpoint reaches `ckpt_path`. The
# hard part is the data: the global random state of a new process is not that of the dead one.

# %%
# ✏️ Exercise 3: write the body of the function
BATCH = 8


def train_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: torch.utils.data.TensorDataset,
    ckpt_path: str,
    stop: int,
    save_every: int = 4,
) -> int:
    raise NotImplementedError("your code here")


# %%
ex.check(3, train_steps)

# %% [markdown]
# ## Summary
#
# * A `state_dict` is an ordered dictionary of parameters **and persistent buffers** (BatchNorm's statistics),
#   module by module: a module's own entries, then its sub-modules'. An optimizer's has `state` (momentum, Adam
#   moments) and `param_groups`, whose parameters are positions: loading pairs them by position, so a changed
#   parameter order misfits silently. A `state_dict` holds references: clone it to keep a snapshot.
#   `parameters()` is a generator, used up after one pass.
# * Save `model.state_dict()`, rebuild the model from its class, `load_state_dict`, then `eval()`. Pickling the
#   whole model stores only a *reference* to its class and breaks when code moves.
# * `torch.load` unpickles, and unpickling can run code. Pass `weights_only=True` explicitly (an environment
#   variable can turn the default off); allow a trusted custom class with
#   `torch.serialization.safe_globals`/`add_safe_globals` (see what a file needs with
#   `get_unsafe_globals_in_checkpoint`), or store plain data. That allow-list is a mitigation, not a sandbox (it
#   has been bypassed at least twice, fixed in 2.6 and 2.10): keep PyTorch updated and take weights from
#   strangers only as `safetensors`.
# * A resumable checkpoint holds model, optimizer, scheduler, `GradScaler`, epoch and step, and the
#   Python/NumPy/torch(/CUDA or MPS) random states, stored as tensors and plain values so that `weights_only=True` loads
#   them (NumPy's array becomes a tensor). With a data order derived from the epoch, the resumed run is
#   **bit-identical** to an uninterrupted one on the CPU. Dropping the RNG or optimizer state breaks that.
# * An atomic save is a temporary file in the same folder (with the mode the umask gives, not `mkstemp`'s
#   private `0o600`), `flush` + `fsync`, `os.replace`, and an `fsync` of the folder: atomic on local POSIX file
#   systems, not promised on Windows or network file systems. `utils.checkpoint_files.save_checkpoint` does it,
#   ends the file with its SHA-256, keeps the last N, deletes what killed saves left and moves checkpoints of an
#   abandoned future to `superseded/`; `load_checkpoint` verifies the SHA-256, raises `CheckpointError` naming a
#   damaged file, can fall back to the previous checkpoint, and restores random states only on the rank that saved
#   them (or every rank, given `rng_states=`).
# * `strict=False` reports missing/unexpected keys but not shape changes; rename keys only at their start. For
#   `module.` (DataParallel/DDP) and `_orig_mod.` (`torch.compile`): wrap the new model the same way before
#   loading, strip the prefix with `consume_prefix_in_state_dict_if_present`, or never save it (`unwrap_model`).
# * `map_location` ("cpu", "cuda:0", `{"cuda:1": "cuda:0"}`, or a function of storage and saved location) decides
#   where loaded tensors live. `mmap=True` maps the file instead of reading it; a model built on the `meta` device
#   plus `load_state_dict(sd, assign=True)` takes the loaded tensors without allocating a random copy
#   (`to_empty(device=...)` first, then a plain load, copies them onto a device instead).
# * TorchScript (`jit.trace`, `jit.script`) is deprecated; tracing silently drops data-dependent branches. Use
#   `torch.export` (with `Dim` for dynamic shapes and `torch.cond` for branches) and `.pt2` files, which Python
#   reloads; to run without Python, compile with AOTInductor (`aoti_compile_and_package`) or use ExecuTorch on
#   devices.

# %% [markdown]
# ## For readers of the original notes (原笔记勘误)
#
# This lesson was built from a teacher's study notes written for PyTorch 1.x. Where they say something that no
# longer holds, or never did, the lesson teaches the current behaviour; this table lists each such place.
#
# | What the notes say | What holds in PyTorch 2.14 | Where this lesson shows it |
# |---|---|---|
# | The optimizer's `state_dict` printout lists `params` as long numbers (`[4675713712, …]`) | They are the positions `0, 1, 2, …`; old ids were labels too, and loading pairs entries with parameters by position, so a changed parameter order misfits silently | §1.2 · The optimizer's state |
# | BatchNorm keeps a "running mean and running std" | It keeps `running_mean`, `running_var` and `num_batches_tracked` | §1.1 · Buffers |
# | `torch.load(PATH)` loads anything (full pickle) | Since 2.6 the default is `weights_only=True`: classes and functions outside an allow-list are refused | §3 · Saving the whole model; §4 · `weights_only=True` |
# | Saving the whole model: "cannot load, reason unclear" | Pickle stores a reference to the class (module path and name), so renaming or moving it breaks loading; the default load also refuses such a file | §3 · Saving the whole model |
# | A checkpoint is `{epoch, model_state_dict, optimizer_state_dict, loss}`, saved as `.tar` | That resumes inexactly: the scheduler, `GradScaler`, step, random states and data position are missing; the extension does not matter (the file is a zip) | §5 · A training checkpoint; §5.1 · What the minimal recipe misses |
# | CPU → GPU: `map_location=lambda storage, loc: storage.cuda(1)` | Works; `map_location="cuda:1"` says the same (and `"cuda:0"` targets another GPU) | §8 · Across devices |
# | Multi-GPU → CPU, solution 1: wrap in `nn.DataParallel`, then `cudnn.benchmark = True` | Wrapping first works; `cudnn.benchmark` has nothing to do with loading (it lets cuDNN pick convolution algorithms by timing them) | §8.2 · The `module.` prefix |
# | Solution 2: `name = k[7:]` | Also cuts 7 characters from keys without the prefix (`submodule.weight` → `le.weight`); use `consume_prefix_in_state_dict_if_present` | §8.2 · The `module.` prefix |
# | Solution 3: `k.replace('module.', '')` | Also rewrites `module.` inside names (`submodule.weight` → `subweight`) | §8.2 · The `module.` prefix |
# | Python 2 checkpoints: patch `pickle` / `serialization.py` to use `encoding='latin1'` | `torch.load(path, encoding="latin1")` takes the option itself and honours it with the safe default `weights_only=True` (ignore the warning that says otherwise); `weights_only=False` only for a trusted file the allow-list refuses | §8.4 · Checkpoints from Python 2 |
# | TorchScript (`torch.jit.trace`, `torch.jit.script`, `jit.save`/`jit.load`) for deployment, with the nested `MyCell` / `MyRNNLoop` / `WrapRNN` example | All of TorchScript is deprecated (`FutureWarning`); the lesson keeps only `MyDecisionGate` to show tracing's flaw, and exports with `torch.export` (`torch.cond` for branches) | §9 · Exporting for deployment |
