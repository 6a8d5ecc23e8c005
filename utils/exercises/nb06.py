"""Checks for the exercises of notebook 06 · save, load and checkpoints (``notebooks/src/06_save_load_checkpoints.py``).
Used by notebook 06, whose ``Checker("06")`` imports it by name. Lives in utils/ because
the checks, and with them the answers, stay out of the learner's notebook; ``make progress`` runs them too.
"""

import ast
import contextlib
import os
import pickle
import shutil
import tempfile

import torch
import torch.nn.functional as F
from torch import nn

from utils.exercises import Hint, Registry, expect, hint, returns
from utils.exercises.rules import functions_reached, global_values, names_used, refers_to, syntax

EXERCISES = Registry("06")

STATE_DICT = "1. What a `state_dict` is"
BUFFERS = "1.1 Buffers: saved state that is not trained"
PREFIXES = "8.2 The `module.` prefix of `DataParallel` and DDP"
COMPILE_PREFIX = "8.3 The `_orig_mod.` prefix of `torch.compile`"
OPT_STATE = "1.2 The optimizer's state: one entry per parameter, matched by position"
WEIGHTS_ONLY = "4. `torch.load` runs code: `weights_only=True`"
CHECKPOINT = "5. A training checkpoint"
MISSES = "5.1 What the minimal recipe misses"


class Tagger(nn.Module):
    """The model of exercise 1, as the notebook defines it."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.1))
        self.head = nn.Linear(8, 3)
        self.register_buffer("temperature", torch.tensor(1.0))
        self.register_buffer("cache", torch.zeros(3), persistent=False)

    def forward(self, x):
        return self.head(self.body(x)) / self.temperature


@EXERCISES.exercise(1, "Predict what a state_dict holds (predict)", STATE_DICT)
def predict_state_dict(answer):
    expect(
        isinstance(answer, (list, tuple)) and len(answer) == 3,
        'give a list of three answers: [an int, an int, a string such as "x.head.weight"]',
    )
    n_model, n_opt, key = answer
    expect(isinstance(n_model, int) and isinstance(n_opt, int), "the first two answers are counts: write them as ints")
    expect(isinstance(key, str), 'the third answer is a key: write it as a string, e.g. "x.head.weight"')

    model = Tagger()
    expected_model = len(model.state_dict())  # 6 parameters + 3 BatchNorm buffers + temperature = 10
    if n_model == 6:
        hint(
            "a: 6 counts only the parameters; the state_dict also holds every persistent buffer, those of "
            "BatchNorm and those the model registers itself: count them too",
            BUFFERS,
        )
    if n_model == expected_model + 1:
        hint("a: `cache` was registered with `persistent=False`, which keeps it out of the state_dict", BUFFERS)
    if n_model == expected_model - 1:
        hint(
            "a: one entry short: a buffer is missing from your count; list every buffer BatchNorm keeps (section "
            "1.1 prints them) and those the model registers with `persistent=True`, the default",
            BUFFERS,
        )
    expect(
        n_model == expected_model,
        "a: count each parameter (weight and bias of both Linear layers and of "
        "BatchNorm; ReLU and Dropout have none) and each persistent buffer",
        BUFFERS,
    )

    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    expected_opt = len(opt.state_dict()["state"])  # one entry per parameter: 6
    if n_opt == 0:
        hint(
            "b: the state is empty only *before* the first step; `step()` creates Adam's state for every "
            "parameter that has a gradient",
            OPT_STATE,
        )
    if n_opt == expected_model:
        hint("b: buffers are not parameters: the optimizer never sees them, so they have no optimizer state", OPT_STATE)
    if n_opt in (2 * expected_opt, 3 * expected_opt):
        hint(
            "b: `state` has one entry per parameter; each entry is a dict holding that parameter's `step`, "
            "`exp_avg` and `exp_avg_sq`",
            OPT_STATE,
        )
    if n_opt == expected_opt - 2:
        hint(
            "b: BatchNorm has two trainable parameters too (`weight` and `bias`, its affine scale and shift)",
            OPT_STATE,
        )
    expect(
        n_opt == expected_opt,
        "b: after one step, Adam keeps one state entry per parameter that had a gradient",
        OPT_STATE,
    )

    expected_key = "_orig_mod.module.head.weight"  # torch.compile(DataParallel(model)): outermost wrapper first
    stripped = key.strip()
    if stripped == "module._orig_mod.head.weight":
        hint(
            "c: the prefixes are in the wrong order: the outermost wrapper's attribute comes first; which object "
            "wraps which in `torch.compile(nn.DataParallel(model))`?",
            PREFIXES,
        )
    if stripped == "head.weight":
        hint(
            "c: each wrapper adds its own prefix, the attribute under which it keeps what it wraps: your key has "
            "none, and the model sits inside two wrappers",
            PREFIXES,
        )
    if stripped == "_orig_mod.head.weight":
        hint(
            "c: each wrapper adds its own prefix, the attribute under which it keeps what it wraps: your key lacks "
            "the prefix of `nn.DataParallel`",
            PREFIXES,
        )
    if stripped == "module.head.weight":
        hint(
            "c: each wrapper adds its own prefix, the attribute under which it keeps what it wraps: your key lacks "
            "the prefix of `torch.compile`",
            COMPILE_PREFIX,
        )
    expect(
        stripped == expected_key,
        "c: write the full key as `state_dict()` prints it, the wrappers' prefixes first, then the name inside Tagger",
        PREFIXES,
    )


# ---------------------------------------------------------------------------------------------- exercise 2


class _Watched:
    """What a learner's function did with files: torch.save targets, torch.load's weights_only, renames."""

    def __init__(self):
        self.saved_to: list[str] = []
        self.weights_only: list[object] = []
        self.renamed: list[tuple[str, str]] = []
        self.removed: list[str] = []
        self.reseeded = 0  # calls of torch.manual_seed / torch.seed: the global generator reseeded


def _path_of(target) -> str | None:
    # a path, or a file object opened on one (its name; a Path's `.name` is only its last part)
    name = target if isinstance(target, (str, bytes, os.PathLike)) else getattr(target, "name", None)
    return os.path.realpath(os.fspath(name)) if isinstance(name, (str, bytes, os.PathLike)) else None


@contextlib.contextmanager
def _watching_files():
    """Record torch.save, torch.load and os.replace/os.rename calls made inside the block; restore them after."""
    seen = _Watched()
    originals = {
        "save": torch.save,
        "load": torch.load,
        "replace": os.replace,
        "rename": os.rename,
        "remove": os.remove,
        "unlink": os.unlink,
        "manual_seed": torch.manual_seed,
        "seed": torch.seed,
    }

    def save(obj, f, *args, **kwargs):
        seen.saved_to.append(_path_of(f))
        return originals["save"](obj, f, *args, **kwargs)

    def load(f, *args, **kwargs):
        seen.weights_only.append(kwargs.get("weights_only"))
        return originals["load"](f, *args, **kwargs)

    def replace(src, dst, *args, **kwargs):
        seen.renamed.append((_path_of(src), _path_of(dst)))
        return originals["replace"](src, dst, *args, **kwargs)

    def rename(src, dst, *args, **kwargs):
        seen.renamed.append((_path_of(src), _path_of(dst)))
        return originals["rename"](src, dst, *args, **kwargs)

    def remove(target, *args, **kwargs):
        seen.removed.append(_path_of(target))
        return originals["remove"](target, *args, **kwargs)

    def unlink(target, *args, **kwargs):
        seen.removed.append(_path_of(target))
        return originals["unlink"](target, *args, **kwargs)

    def manual_seed(*args, **kwargs):
        seen.reseeded += 1
        return originals["manual_seed"](*args, **kwargs)

    def seed(*args, **kwargs):
        seen.reseeded += 1
        return originals["seed"](*args, **kwargs)

    torch.save, torch.load, os.replace, os.rename = save, load, replace, rename
    os.remove, os.unlink = remove, unlink
    torch.manual_seed = torch.random.manual_seed = manual_seed
    torch.seed = torch.random.seed = seed
    try:
        yield seen
    finally:
        torch.save, torch.load = originals["save"], originals["load"]
        os.replace, os.rename = originals["replace"], originals["rename"]
        os.remove, os.unlink = originals["remove"], originals["unlink"]
        torch.manual_seed = torch.random.manual_seed = originals["manual_seed"]
        torch.seed = torch.random.seed = originals["seed"]


def _uses_the_checks(*fns) -> bool:
    """Whether an answer imports this course's checks (which hold the reference answers)."""
    for fn in fns:
        for f in functions_reached(fn):
            if any(n.startswith("utils.exercises") for n in names_used(f)):
                return True
            for value in global_values(f).values():
                module = getattr(value, "__module__", None) or getattr(value, "__name__", "")
                if isinstance(module, str) and module.startswith("utils.exercises"):
                    return True
    return False


UNSAFE_LOAD = (
    "it makes `torch.load` unpickle arbitrary objects, and unpickling runs code: a checkpoint you download or "
    "share could run anything on your machine. A checkpoint of state_dicts, tensors and plain values loads with "
    "the safe default"
)


def _unsafe_loading(seen: _Watched) -> None:
    """Hint when the learner's code switched weights_only off to load its file."""
    if any(w is False for w in seen.weights_only):
        hint(f"your code calls `torch.load(..., weights_only=False)`: {UNSAFE_LOAD}", WEIGHTS_ONLY)
    if os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0") not in ("", "0"):
        hint(f"`TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD` is set: {UNSAFE_LOAD}", WEIGHTS_ONLY)


def _allow_listed(what: str) -> None:
    hint(
        f"your code allow-listed {what} to load objects that are not state: an allow-list is for a class you "
        "trust that a file truly needs; a checkpoint of state_dicts, tensors and plain values needs none",
        "4.1 Allowing a class you trust",
    )


def _small_net() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, x: torch.Tensor, y: torch.Tensor) -> None:
    """Random batches and dropout, both from torch's global generator, so resuming needs its state."""
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, len(x), (8,))
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()


def _same_optimizer_state(a: dict, b: dict) -> bool:
    if sorted(a["state"]) != sorted(b["state"]):
        return False
    for index, state in a["state"].items():
        other = b["state"][index]
        if sorted(state) != sorted(other):
            return False
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                if not torch.equal(value, torch.as_tensor(other[name])):
                    return False
            elif value != other[name]:
                return False
    return True


REFUSED = (
    "`torch.load` (weights_only=True, the default) refused an object in your file: store only "
    "tensors, state_dicts and plain Python values, never the model or optimizer object itself, and "
    "no NumPy arrays (NumPy's random state holds one: section 5.2 stores it as a tensor; only torch's "
    "generator matters here)"
)


_DEFAULT_SAFE_GLOBALS = list(torch.serialization.get_safe_globals())
"""The allow-list when the exercise section's first cell ran (it imports this module), before any answer."""


def _unsafe_globals(path: str) -> list[str]:
    """What ``torch.load(path)`` with weights_only=True refuses as a new process would, with the default allow-list
    (classes the learner allow-listed are set aside meanwhile, then put back); empty when the file loads."""
    current = list(torch.serialization.get_safe_globals())
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(_DEFAULT_SAFE_GLOBALS)
    try:
        torch.load(path, weights_only=True)
        return []
    except pickle.UnpicklingError:
        return torch.serialization.get_unsafe_globals_in_checkpoint(path) or ["an object"]
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(current)


def _says_weights_only_false(*fns) -> bool:
    """Whether the source of the answer (or a helper it calls) passes ``weights_only=False``."""
    for fn in fns:
        for f in functions_reached(fn):
            tree = syntax(f)
            for node in ast.walk(tree) if tree is not None else ():
                if isinstance(node, ast.keyword) and node.arg == "weights_only":
                    if isinstance(node.value, ast.Constant) and node.value.value is False:
                        return True
    return False


def _call_load(load_fn, path, model, opt):
    try:
        return returns(load_fn, path, model, opt)
    except pickle.UnpicklingError:
        hint(REFUSED, WEIGHTS_ONLY)
    except RuntimeError as err:
        if "Missing key(s)" in str(err) and "running_" in str(err):
            hint(
                "the file lacks BatchNorm's running statistics: they are buffers, not parameters, so save "
                "`model.state_dict()` rather than the parameters",
                BUFFERS,
            )
        raise


DECOY_STEP = 99
WHOLE_JOB = ("save_checkpoint", "load_checkpoint")  # the course's helpers that write and read the whole checkpoint


def _tensors_in(obj) -> list[torch.Tensor]:
    """Every tensor in a loaded checkpoint (nested dicts, lists and tuples)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for value in obj.values() for t in _tensors_in(value)]
    if isinstance(obj, (list, tuple)):
        return [t for value in obj for t in _tensors_in(value)]
    return []


def _holds(tensors: list[torch.Tensor], wanted: torch.Tensor) -> bool:
    return any(t.shape == wanted.shape and t.dtype == wanted.dtype and torch.equal(t, wanted) for t in tensors)


def _file_holds_the_state(path: str, saved_model: dict, saved_opt: dict, saved_rng: torch.Tensor) -> None:
    """The file itself, read back as a new process would, holds the weights, buffers, optimizer state and RNG state."""
    if os.path.getsize(path) == 0:
        hint(
            "`save_state` left the file at `path` empty: a new process has nothing but that file, so everything "
            "needed to continue must be written into it with `torch.save`",
            CHECKPOINT,
        )
    try:
        tensors = _tensors_in(torch.load(path, weights_only=True))
    except Exception as err:  # a torn, empty or foreign file
        hint(
            f"`torch.load` cannot read the file at `path` back ({type(err).__name__}): write the checkpoint "
            "with `torch.save(checkpoint, path)`",
            CHECKPOINT,
        )
    missing = [k for k, v in saved_model.items() if not _holds(tensors, v)]
    missing += [
        f"optimizer state {k}"
        for state in saved_opt["state"].values()
        for k, v in state.items()
        if isinstance(v, torch.Tensor) and v.dim() > 0 and not _holds(tensors, v)
    ]
    if missing:
        hint(
            f"the file at `path` does not hold `{missing[0]}`: `load_state` must restore everything from the file "
            "alone (the check loads a copy of it, elsewhere), because a resumed job is a new process that has "
            "nothing else; keeping state in Python variables only works inside the process that saved it",
            CHECKPOINT,
        )
    if not _holds(tensors, saved_rng):
        hint(
            "the file at `path` does not hold torch's random state as `torch.get_rng_state()` returns it: the "
            "resumed job must read that state from the file, a new process has nothing else",
            "5.2 Random states that load with `weights_only=True`",
        )


@EXERCISES.exercise(2, "A checkpoint that resumes bit for bit (write a function)", MISSES)
def save_and_load(save_fn, load_fn):
    if _uses_the_checks(save_fn, load_fn):
        hint("your functions use the checks' own code: write them yourself")
    if found := refers_to(save_fn, *WHOLE_JOB) or refers_to(load_fn, *WHOLE_JOB):
        hint(
            f"your functions call the course's `{found}`, which decides for you what a checkpoint holds: that "
            "choice is this exercise. Write the dict yourself and save it with `torch.save` (helpers for a part, "
            "such as `rng_state_dict` or `atomic_torch_save`, are fine)",
            MISSES,
        )
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g)
    optimizers = [
        ("SGD with momentum", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 3, 5),
        ("AdamW", lambda p: torch.optim.AdamW(p, lr=0.01), 5, 4),
    ]
    with torch.random.fork_rng(devices=[]), tempfile.TemporaryDirectory() as tmp:
        for case, (name, make_opt, done, more) in enumerate(optimizers):
            torch.manual_seed(case)
            model = _small_net()
            opt = make_opt(model.parameters())
            _train(model, opt, done, x, y)
            saved_model = {k: v.clone() for k, v in model.state_dict().items()}
            saved_opt = opt.state_dict()
            saved_opt = {
                "state": {
                    i: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
                    for i, s in saved_opt["state"].items()
                }
            }
            saved_rng = torch.get_rng_state()

            path = os.path.join(tmp, f"state_{case}.pt")
            save_fn(path, model, opt, done)
            expect(
                os.path.isfile(path),
                "`save_state` wrote no file at `path`: write the checkpoint with `torch.save(checkpoint, path)`",
                CHECKPOINT,
            )
            expect(
                torch.equal(torch.get_rng_state(), saved_rng),
                "`save_state` changed torch's random state: read it with `torch.get_rng_state()`, do not draw numbers",
            )
            if os.path.getsize(path) == 0:
                _file_holds_the_state(path, saved_model, saved_opt, saved_rng)
            refused = _unsafe_globals(path)  # what a new process loads from the file alone, with the safe default
            if refused:
                if _says_weights_only_false(save_fn, load_fn):
                    hint(
                        "your file holds objects that only `torch.load(..., weights_only=False)` loads, and your "
                        f"`load_state` switches the safe default off for them: {UNSAFE_LOAD}",
                        WEIGHTS_ONLY,
                    )
                _unsafe_loading(_Watched())
                allowed = set(map(repr, torch.serialization.get_safe_globals())) - set(map(repr, _DEFAULT_SAFE_GLOBALS))
                if refers_to(load_fn, "safe_globals", "add_safe_globals") or any(
                    refused[0].rsplit(".", 1)[-1] in name for name in allowed
                ):
                    _allow_listed(f"`{refused[0]}`")
                hint(REFUSED, WEIGHTS_ONLY)
            # the job resumes on another machine, from a copy of the file
            moved = os.path.join(tmp, f"copied_{case}.pt")
            shutil.copyfile(path, moved)
            # another checkpoint, saved after this one: `load_state(path, ...)` must still give this one
            torch.manual_seed(50 + case)
            decoy = _small_net()
            decoy_opt = make_opt(decoy.parameters())
            _train(decoy, decoy_opt, 1, x, y)
            save_fn(os.path.join(tmp, f"other_{case}.pt"), decoy, decoy_opt, DECOY_STEP)
            decoy_state = {k: v.clone() for k, v in decoy.state_dict().items()}
            torch.set_rng_state(saved_rng)
            _train(model, opt, more, x, y)  # the run that never stopped
            reference = model.state_dict()

            torch.manual_seed(100 + case)  # a new process: other initial weights, other random state
            fresh = _small_net()
            fresh_opt = make_opt(fresh.parameters())
            before = {k: v.clone() for k, v in fresh.state_dict().items()}
            torch.manual_seed(12345)
            with _watching_files() as seen:
                try:
                    step = _call_load(load_fn, moved, fresh, fresh_opt)
                except Hint:
                    raise
                except Exception:
                    _file_holds_the_state(moved, saved_model, saved_opt, saved_rng)  # state kept elsewhere?
                    raise
            _unsafe_loading(seen)
            from_decoy = step == DECOY_STEP or all(
                torch.equal(fresh.state_dict()[k], decoy_state[k]) for k, _ in fresh.named_parameters()
            )
            if from_decoy:
                hint(
                    "`load_state(path, ...)` restored the checkpoint saved last (to another path), not the one in "
                    "the file at `path`: read everything from that file. A new process has only the file, none of "
                    "the Python variables of the process that saved it",
                    CHECKPOINT,
                )
            expect(
                isinstance(step, int) and not isinstance(step, bool),
                f"`load_state` should return the step as an int, not {type(step).__name__}",
            )
            expect(
                step == done,
                f"`load_state` returned step {step}, but the checkpoint was saved at step {done}: "
                "store the step in the file and return it",
            )
            loaded = fresh.state_dict()
            params = {name for name, _ in fresh.named_parameters()}
            if any(not torch.equal(loaded[k], saved_model[k]) for k in params):
                hint(
                    "the model's weights were not restored: call `model.load_state_dict(...)` on the model you "
                    "were given (assigning a new object to the name `model` inside the function changes "
                    "nothing outside it)",
                    "2. Save and load the `state_dict` (recommended)",
                )
            changed = [k for k, v in saved_model.items() if not torch.equal(loaded[k], v)]
            if changed and any(not torch.equal(loaded[k], before[k]) for k in changed):
                hint(
                    "BatchNorm's running statistics were loaded, then changed: `load_state` ran the model in "
                    "training mode after loading (every forward pass in `train()` updates them); only restore "
                    "state there",
                    BUFFERS,
                )
            if changed:
                hint(
                    "the weights are back but BatchNorm's running statistics are not: they are buffers, so "
                    "save and load `model.state_dict()`, not only the parameters",
                    BUFFERS,
                )
            now_opt = fresh_opt.state_dict()
            if not now_opt["state"]:
                hint(
                    f"the optimizer ({name}) starts empty after loading: its state (momentum buffers, Adam's "
                    "moments and step count) must be saved with `optimizer.state_dict()` and restored with "
                    "`optimizer.load_state_dict(...)`",
                    MISSES,
                )
            expect(
                _same_optimizer_state(saved_opt, now_opt),
                f"the optimizer state ({name}) after loading "
                "differs from the one saved: save `optimizer.state_dict()` and load it into the optimizer "
                "you were given",
                MISSES,
            )
            if not torch.equal(torch.get_rng_state(), saved_rng):
                if not _holds(_tensors_in(torch.load(moved, weights_only=True)), saved_rng):
                    hint(
                        "after `load_state`, torch's random state is not the one saved, so the resumed run draws "
                        "other batches and other dropout masks: the file does not hold torch's random state, "
                        "which must be saved with the rest and restored last",
                        MISSES,
                    )
                hint(
                    "after `load_state`, torch's random state is not the one saved, so the resumed run draws "
                    "other batches and other dropout masks: the file holds it, but `load_state` did not restore it, "
                    "or drew random numbers after restoring it",
                    MISSES,
                )
            _file_holds_the_state(moved, saved_model, saved_opt, saved_rng)
            _train(fresh, fresh_opt, more, x, y)
            resumed = fresh.state_dict()
            expect(
                all(torch.allclose(resumed[k].float(), reference[k].float(), rtol=0, atol=1e-6) for k in reference),
                f"with {name}, the resumed run ends with other weights than the run that never stopped, "
                "although weights, optimizer and random state were restored: does `load_state` change "
                "anything else (the random state after restoring it)?",
                MISSES,
            )


# ---------------------------------------------------------------------------------------------- exercise 3

BATCH = 8


def _classifier() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))


def _indices(batch: torch.Tensor, x_all: torch.Tensor) -> list[int]:
    match = (batch[:, None, :] == x_all[None, :, :]).all(dim=-1)
    if not bool((match.sum(dim=1) == 1).all()):
        hint("the model was fed inputs that are not rows of the dataset: pass each sample's `x` unchanged")
    return match.float().argmax(dim=1).tolist()


def _run(fn, x_all, dataset, path, stop, seed, rng_seed, files: list | None = None):
    """Build a model and optimizer from `seed`, call the learner's function; return (model, opt, start, batches).
    What the function did with files is appended to ``files``."""
    torch.manual_seed(seed)
    model = _classifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    seen: list[list[int]] = []
    handle = model.register_forward_pre_hook(lambda module, args: seen.append(_indices(args[0], x_all)))
    torch.manual_seed(rng_seed)
    try:
        try:
            with _watching_files() as watched:
                start = returns(fn, model, opt, dataset, path, stop)
            if files is not None:
                files.append(watched)
            _unsafe_loading(watched)
            if watched.reseeded:
                hint(
                    "your function reseeds torch's global random generator (`torch.manual_seed`): that overwrites "
                    "the random state the rest of the program draws from (initialisation, dropout, other code), "
                    "and every later draw repeats. Shuffle with a generator of your own, which leaves the global "
                    "one alone",
                    MISSES,
                )
        except pickle.UnpicklingError:
            hint(
                "`torch.load` (weights_only=True) refused an object in your checkpoint: store state_dicts and "
                "plain values, never the model or optimizer object",
                WEIGHTS_ONLY,
            )
    finally:
        handle.remove()
    expect(
        isinstance(start, int) and not isinstance(start, bool),
        f"return the step the run started from, as an int, not {type(start).__name__}",
    )
    expect(
        all(len(b) == BATCH for b in seen),
        f"every step should train on one batch of BATCH = {BATCH} samples, "
        f"got batches of {sorted({len(b) for b in seen})}",
        "04 · 3. The data pipeline, part 2: `DataLoader` and `collate_fn` turn samples into batches",
    )
    return model, opt, start, seen


def _params_close(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.allclose(p, q, rtol=0, atol=1e-6) for p, q in zip(a.parameters(), b.parameters()))


@EXERCISES.exercise(3, "Resume in the middle of an epoch (stretch)", MISSES)
def resume_mid_epoch(fn):
    # (samples, stop, where the first run dies): 5 and 3 steps per epoch; the last checkpoint is mid-epoch
    for n, stop, crash in ((40, 20, 14), (24, 10, 7)):
        per_epoch = n // BATCH
        saved_at = crash // 4 * 4  # save_every = 4
        g = torch.Generator().manual_seed(n)
        x_all, y_all = torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)
        dataset = torch.utils.data.TensorDataset(x_all, y_all)
        files: list[_Watched] = []
        with torch.random.fork_rng(devices=[]), tempfile.TemporaryDirectory() as tmp:
            paths = {name: os.path.join(tmp, f"{name}.pt") for name in ("straight", "crashed", "to_save")}
            straight, _, start, seen = _run(
                fn, x_all, dataset, paths["straight"], stop, seed=0, rng_seed=0, files=files
            )
            expect(
                start == 0, f"with no file at `ckpt_path` the run starts at step 0, but the function returned {start}"
            )
            expect(
                len(seen) == stop,
                f"asked to train up to step {stop}, the model ran {len(seen)} forward passes: "
                "one step (one forward pass) per batch, from the start step up to `stop`",
            )
            expect(
                os.path.isfile(paths["straight"]),
                "no checkpoint was written to `ckpt_path`: save after every `save_every` steps",
                CHECKPOINT,
            )
            if refused := _unsafe_globals(paths["straight"]):
                hint(
                    f"your checkpoint holds `{refused[0]}`, which `torch.load` refuses with weights_only=True (the "
                    "default): store state_dicts and plain values, never the model or optimizer object",
                    WEIGHTS_ONLY,
                )
            epochs = [sum(seen[e * per_epoch : (e + 1) * per_epoch], []) for e in range(stop // per_epoch)]
            for order in epochs:
                expect(
                    sorted(order) == list(range(n)),
                    "each epoch should visit every sample exactly once: its order must be a permutation of the "
                    "indices, in which no index repeats or is left out",
                    "04 · 4. The data pipeline, part 3: samplers choose the indices",
                )
            expect(
                epochs[0] != list(range(n)),
                "the samples come in their stored order: shuffle them",
                "04 · 3. The data pipeline, part 2: `DataLoader` and `collate_fn` turn samples into batches",
            )
            expect(
                epochs[0] != epochs[1],
                "every epoch sees the samples in the same order: shuffle anew each epoch, and still so that a "
                "restarted job can compute any epoch's order",
                "04 · 3. The data pipeline, part 2: `DataLoader` and `collate_fn` turn samples into batches",
            )
            for e, order in enumerate(epochs):
                steps = {(b - a) % n for a, b in zip(order, order[1:])}
                rotated = e and any(order == epochs[e - 1][k:] + epochs[e - 1][:k] for k in range(n))
                if len(steps) == 1 or rotated:
                    hint(
                        f"the order of epoch {e} is a fixed pattern, not a shuffle: "
                        + (
                            "each index a constant step after the previous one (a stride, a rotation or a flip)"
                            if len(steps) == 1
                            else "the previous epoch's order rotated"
                        )
                        + ". The model then meets the samples in a predictable order that repeats from epoch to "
                        "epoch; a shuffle draws a random permutation every epoch",
                        "04 · 4. The data pipeline, part 3: samplers choose the indices",
                    )

            _, _, start, seen_crashed = _run(
                fn, x_all, dataset, paths["crashed"], crash, seed=0, rng_seed=0, files=files
            )
            expect(
                seen_crashed == seen[:crash],
                "two runs from the same seed saw different batches: the order "
                "must be a function of the epoch only, the same in every process",
                MISSES,
            )

            # the state after `saved_at` steps, for comparison: a run that stops right there
            at_save, at_save_opt, _, _ = _run(
                fn, x_all, dataset, paths["to_save"], saved_at, seed=0, rng_seed=0, files=files
            )
            # the job restarts on another machine, from a copy of the file; another job has saved since
            moved = os.path.join(tmp, "moved.pt")
            shutil.copyfile(paths["crashed"], moved)
            other, _, _, _ = _run(fn, x_all, dataset, os.path.join(tmp, "other.pt"), 4, seed=3, rng_seed=3, files=files)
            probe, probe_opt, start, probe_seen = _run(fn, x_all, dataset, moved, saved_at, seed=7, rng_seed=999)
            if start == 4 != saved_at or (_params_close(probe, other) and not _params_close(other, at_save)):
                hint(
                    "the resumed job holds the weights another job saved last (to another path), not those of the "
                    "file at `ckpt_path`: resume from that file alone. A restarted job is a new process, often on "
                    "another machine, with none of the Python variables of the one that died",
                    CHECKPOINT,
                )
            if start == 0 and len(probe_seen) == saved_at:
                hint(
                    "the function did not resume: when a file exists at `ckpt_path`, load it first and continue "
                    "from the step stored in it"
                )
            if saved_at < start <= crash:
                hint(
                    f"the restarted job found a checkpoint of step {start}, saved after step {crash}: your function "
                    "saves more often than every `save_every` steps. Each save costs time and disk writes (minutes "
                    "for a large model), which is why `save_every` exists: here, save after global steps 4, 8 and 12 "
                    "only",
                    CHECKPOINT,
                )
            expect(
                start == saved_at,
                f"the first run died after step {crash}; its last checkpoint holds step "
                f"{saved_at} (one every 4 steps), but the resumed function returned {start}: store the step "
                "in the checkpoint and return it",
            )
            expect(
                not probe_seen,
                f"resumed at step {saved_at} with stop={saved_at}, the function still trained "
                f"{len(probe_seen)} steps: continue from the checkpoint's step, up to `stop`",
            )
            if not _params_close(probe, at_save):
                one_more, _, _, _ = _run(
                    fn, x_all, dataset, os.path.join(tmp, "one_more.pt"), saved_at + 1, seed=0, rng_seed=0
                )
                if _params_close(probe, one_more):
                    hint(
                        f"the checkpoint that says step {saved_at} holds the weights after {saved_at + 1} steps: "
                        f"save after global steps 4, 8, 12 (with a 0-based loop index `step`, when "
                        "`(step + 1) % save_every == 0`) and store the number of steps done, `step + 1`",
                        CHECKPOINT,
                    )
            expect(
                _params_close(probe, at_save),
                "after resuming, the model's weights are not those saved in the "
                "checkpoint: save `model.state_dict()` and load it with `model.load_state_dict`",
                CHECKPOINT,
            )
            momentum = [s.get("momentum_buffer") for s in probe_opt.state_dict()["state"].values()]
            if not momentum or any(m is None for m in momentum):
                hint(
                    "after resuming, the optimizer has no momentum buffers: save `optimizer.state_dict()` in "
                    "the checkpoint and load it, or the next steps differ",
                    MISSES,
                )
            expect(
                all(
                    torch.allclose(a["momentum_buffer"], b["momentum_buffer"], rtol=0, atol=1e-6)
                    for a, b in zip(
                        probe_opt.state_dict()["state"].values(), at_save_opt.state_dict()["state"].values()
                    )
                ),
                "after resuming, the momentum buffers differ from those of the run that stopped there",
                MISSES,
            )

            resumed, _, start, resumed_seen = _run(
                fn, x_all, dataset, paths["crashed"], stop, seed=8, rng_seed=12345, files=files
            )
            expected = seen[saved_at:stop]
            if resumed_seen and resumed_seen[0] == seen[saved_at - saved_at % per_epoch] and saved_at % per_epoch:
                hint(
                    f"the resumed run restarted epoch {saved_at // per_epoch} from its first batch, so it trained "
                    f"on {saved_at % per_epoch} batches twice: skip the batches of the epoch that are already done "
                    "(step % steps_per_epoch)"
                )
            expect(
                resumed_seen == expected,
                "the resumed run saw other batches than the run that never stopped: "
                "derive each epoch's order from the epoch number alone, not from "
                "torch's global random state, which a new process does not share",
                MISSES,
            )
            expect(
                _params_close(resumed, straight),
                "the resumed run saw the right batches but ends with other "
                "weights than the run that never stopped: is everything the next steps use saved and loaded?",
                MISSES,
            )
            _saved_atomically(files, tmp)


ATOMIC = "5.3 Saving so that a crash cannot tear the file"


def _saved_atomically(files: list[_Watched], folder: str) -> None:
    """The checkpoints reached `ckpt_path` by a rename of a file written in the same folder, never in place."""
    names = ("straight.pt", "crashed.pt", "to_save.pt", "one_more.pt", "other.pt")  # the `ckpt_path`s the check passed
    ckpts = {os.path.realpath(os.path.join(folder, name)) for name in names}
    if any(target in ckpts for seen in files for target in seen.saved_to):
        hint(
            "`torch.save` wrote straight to `ckpt_path`: a job killed during the save leaves a torn file there, "
            "and the previous checkpoint is already overwritten, so the restart has nothing to resume from. "
            "Write to a temporary file first, then put it under the final name in one step",
            ATOMIC,
        )
    if any(target in ckpts for seen in files for target in seen.removed):
        hint(
            "your function deletes `ckpt_path` before renaming the new file onto it: a job killed between the "
            "two steps leaves no checkpoint at all. `os.replace(tmp, ckpt_path)` swaps the file in one step, "
            "overwriting the old one (`os.rename` refuses an existing target on Windows)",
            ATOMIC,
        )
    renames = [(src, dst) for seen in files for src, dst in seen.renamed if dst in ckpts]
    if not renames:
        hint(
            "the checkpoint reached `ckpt_path` without a rename: a copy or a second write can be torn by a "
            "kill just as a direct save can. Write to a temporary file, then `os.replace(tmp, ckpt_path)`",
            ATOMIC,
        )
    if any(src is None or os.path.dirname(src) != os.path.dirname(dst) for src, dst in renames):
        hint(
            "the temporary file was written in another folder than `ckpt_path`, which may be on another file "
            "system: a rename is atomic only within one (across two, `os.replace` fails), so create the temporary "
            "file in the checkpoint's folder",
            ATOMIC,
        )
