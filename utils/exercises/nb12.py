"""Checks for the exercises of notebook 12 · reproducibility (``notebooks/src/12_reproducibility.py``).
Used by notebook 12, whose ``Checker("12")`` imports it by name. Lives in utils/ because
the checks, and with them the answers, stay out of the learner's notebook; ``make progress`` runs them too.
"""

import contextlib
import io
import marshal
import pickle
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import utils.checkpoint_files
from utils.exercises import Registry, expect, hint, returns
from utils.exercises.rules import assigned_names, calls_to, refers_to

EXERCISES = Registry("12")

S_SEED = "1. One seed for every generator"
S_PROOF = "3. Proof: two runs, identical parameters, and what breaks it"
S_GENERATORS = "1.2 Generator objects: `np.random.default_rng` and `torch.Generator`"
S_WORKERS = "1.3 DataLoader workers: `generator` and `worker_init_fn`"
S_WEIGHTS_ONLY = "06 · 4. `torch.load` runs code: `weights_only=True`"
S_CHECKPOINT = "06 · 5. A training checkpoint"

IDENTICAL = [True, True, False, False]
WHY = [
    (
        "(a) is identical: the default generator is a torch.Generator like any other, and a fresh one seeded with "
        "the same number produces the same stream",
        S_GENERATORS,
    ),
    (
        "(b) is identical: NumPy and Python's random have generators of their own; drawing from them does not move "
        "torch's",
        S_SEED,
    ),
    (
        "(c) differs: every `iter()` of a DataLoader draws one number from the loader's generator, or from the "
        "global one when it has none, as the base seed of its worker processes, even with num_workers=0 and no "
        "shuffling (`_BaseDataLoaderIter.__init__`); the later randn starts one draw further on",
        S_WORKERS,
    ),
    (
        "(d) differs: the loader's generator moves on as it shuffles, so every epoch gets a new order; it is the "
        "sequence of orders that repeats when the loader is built again with the same seed",
        S_PROOF,
    ),
]


@EXERCISES.exercise(1, "Identical or not? (predict)", S_PROOF)
def identical(answer):
    expect(
        isinstance(answer, (list, tuple)) and len(answer) == 4,
        "give a list of four booleans, one per pair (a) to (d): True where the two results are identical",
    )
    expect(
        all(isinstance(a, (bool, np.bool_)) or (type(a) is int and a in (0, 1)) for a in answer),
        "write each answer as True (a and b are identical) or False",
    )
    wrong = [i for i, (a, b) in enumerate(zip(answer, IDENTICAL)) if bool(a) != b]
    if wrong:
        why, section = WHY[wrong[0]]
        more = f" ({len(wrong)} pairs are misjudged in all)" if len(wrong) > 1 else ""
        hint(why + more, section)


def _epoch(loader):
    return [int(i) for batch in loader for i in torch.as_tensor(batch).flatten()]


@EXERCISES.exercise(2, "A loader whose shuffling repeats (write a function)", S_PROOF)
def seeded_loader(fn):
    with _keep_global_generators():
        torch.manual_seed(4321)  # a known global state, whatever ran before
        _seeded_loader(fn)


def _other_globals():
    return random.getstate(), np.random.get_state()[1].tolist()


def _seeded_loader(fn):
    dataset = range(12)
    state, others = torch.get_rng_state(), _other_globals()
    loader = returns(fn, dataset, 4, 7)
    expect(isinstance(loader, DataLoader), f"return a DataLoader, not a {type(loader).__name__}")
    if not torch.equal(state, torch.get_rng_state()):
        hint(
            "building your loader reseeded or drew from the global generator (torch.manual_seed?): that restarts "
            "every other random draw of the program (initialisation, Dropout) too; give the loader a generator "
            "of its own instead"
        )
    state = torch.get_rng_state()
    try:
        batches = list(loader)
    except Exception as err:  # a loader built wrongly fails only when iterated, here in the check
        message = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        hint(
            f"iterating over your DataLoader raised {type(err).__name__}: {message} (a `sampler=` yields one index at "
            "a time; a `BatchSampler` goes in `batch_sampler=`)"
        )
    one, two = _epoch(batches), _epoch(loader)
    iteration_draws = not torch.equal(state, torch.get_rng_state())
    if _other_globals() != others:
        hint(
            "your loader reseeded or drew from Python's or NumPy's global generator: that moves every other random "
            "draw of the program that uses it (augmentations, a later shuffle); keep the loader's randomness in a "
            "generator of its own, `torch.Generator().manual_seed(seed)` passed as generator="
        )
    expect(len(batches[0]) == 4, f"the batches should hold batch_size = 4 samples, not {len(batches[0])}")
    expect(sorted(one) == list(range(12)), "an epoch should deliver every sample exactly once")
    if one == list(range(12)) and two == list(range(12)):
        hint("the samples come in their stored order: pass shuffle=True (or a RandomSampler)")
    torch.manual_seed(1234)
    torch.randn(5)  # the rest of the program draws something
    again = fn(dataset, 4, 7)
    if (_epoch(again), _epoch(again)) != (one, two):
        hint(
            "the same seed gave another order after the program drew a random number: the loader shuffles with "
            "the global generator; pass generator=torch.Generator().manual_seed(seed)"
        )
    other = fn(dataset, 4, 8)
    expect(
        (_epoch(other), _epoch(other)) != (one, two),
        "seeds 7 and 8 give the same orders: the seed argument "
        "is not used (a fresh torch.Generator() always starts from the same default seed)",
    )
    expect(
        one != two,
        "every epoch comes in the same order: shuffle anew each epoch (a shuffled DataLoader with a "
        "seeded generator does; one permutation drawn in advance does not)",
    )
    if iteration_draws:
        hint(
            "the shuffle repeats, but each epoch still draws from the global generator: the DataLoader itself has "
            "no generator, so `iter()` takes the workers' base seed from the global one (a sampler's generator "
            "is not used for that); pass generator= to the DataLoader",
            S_WORKERS,
        )


def _draws():
    found = {
        "Python's random": [random.random() for _ in range(3)],
        "NumPy": np.random.rand(3).tolist(),
        "torch (CPU)": torch.rand(3).tolist() + F.dropout(torch.ones(8), 0.5).tolist(),
    }
    if torch.cuda.is_available():
        found["torch (CUDA)"] = torch.rand(3, device="cuda").tolist()
    return found


def _seed_all(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _global_states():
    return (
        random.getstate(),
        np.random.get_state(),
        torch.get_rng_state(),
        torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    )


def _set_global_states(saved):
    random.setstate(saved[0])
    np.random.set_state(saved[1])
    torch.set_rng_state(saved[2])
    if saved[3] is not None:
        torch.cuda.set_rng_state_all(saved[3])


@contextlib.contextmanager
def _keep_global_generators():
    """Leave the learner's generators as they were before the check."""
    saved = _global_states()
    try:
        yield
    finally:
        _set_global_states(saved)


HOW = {
    "Python's random": "random.getstate() / random.setstate()",
    "NumPy": "np.random.get_state() / np.random.set_state()",
    "torch (CPU)": "torch.get_rng_state() / torch.set_rng_state()",
    "torch (CUDA)": "torch.cuda.get_rng_state_all() / torch.cuda.set_rng_state_all() (the CPU state does not "
    "include the GPUs')",
}


CUDA_READ = ("get_rng_state_all", "cuda.get_rng_state", "cuda.random.get_rng_state", "default_generators")
CUDA_WRITE = ("set_rng_state_all", "cuda.set_rng_state", "cuda.random.set_rng_state", "default_generators")
"""The ways to read and set the CUDA generators' states (`torch.cuda.default_generators[i].get_state()` too)."""


UNPICKLING = (pickle.loads, pickle.load, pickle.Unpickler.load, pickle._Unpickler.load, marshal.loads, eval, exec)
"""What runs code named by a checkpoint's bytes: the hole `weights_only=True` closes."""
UNPICKLING_LABELS = {"loads": "pickle.loads", "load": "pickle.load", "Unpickler.load": "pickle.Unpickler.load"}
UNPICKLING_NAMES = ("pickle", "_pickle", "cPickle", "dill", "cloudpickle", "Unpickler", "marshal")
COURSE_RNG = (utils.checkpoint_files.rng_state_dict, utils.checkpoint_files.load_rng_state_dict)
COURSE_RNG_NAMES = ("rng_state_dict", "load_rng_state_dict", "checkpoint_files")
NOT_PICKLE = (
    "that runs whatever code the bytes name, the hole `torch.load(weights_only=True)` closes, so the checkpoint "
    "would be as unsafe to load as with weights_only=False; keep the states as plain data (tensors, numbers, "
    "lists), which the weights-only loader reads without running code"
)
WRITE_YOUR_OWN = (
    "write your own, since the exercise practises which generators a program has and how each one's state is read and "
    "put back, which the course's helper hides (compare with it afterwards)"
)


def _numbers_in(value):
    """How many numbers a loaded snapshot holds (tensor elements, ints, floats, characters)."""
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, dict):
        return sum(_numbers_in(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_numbers_in(v) for v in value)
    return 1


def _saved_and_loaded(snapshot):
    buffer = io.BytesIO()
    torch.save(snapshot, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@EXERCISES.exercise(3, "Save and restore every generator (stretch)", S_CHECKPOINT)
def snapshot_restore(rng_snapshot, rng_restore):
    for function in (rng_snapshot, rng_restore):
        name = refers_to(function, *(n for n in COURSE_RNG_NAMES if n not in assigned_names(function)))
        if name:
            hint(f"`{function.__name__}` uses the course's `{name}`: {WRITE_YOUR_OWN}")
    name = refers_to(rng_restore, *(n for n in UNPICKLING_NAMES if n not in assigned_names(rng_restore)))
    if name:
        hint(f"`rng_restore` uses `{name}` to unpickle what the checkpoint holds: {NOT_PICKLE}", S_WEIGHTS_ONLY)
    with _keep_global_generators():
        _seed_all(12)
        start = _draws()  # right after seeding
        _draws()
        here = _global_states()
        undisturbed = _draws()  # what follows when no snapshot is taken
        _set_global_states(here)
        with calls_to(*COURSE_RNG) as course:
            snapshot = returns(rng_snapshot)
        expected = _draws()
        moved = [name for name in expected if expected[name] != undisturbed.get(name)]
        if moved and not course:
            hint(
                f"taking the snapshot changed what {moved[0]} draws next: `rng_snapshot` reseeded the generators "
                "or drew from them. A snapshot must only read where each stream is, so that a run that saves a "
                "checkpoint draws the same numbers as one that does not; a seed only marks where a stream starts. "
                f"Read each generator's state ({HOW[moved[0]]}) and leave the generator alone"
            )
        with calls_to(*COURSE_RNG) as more:
            later = rng_snapshot()  # a second snapshot, further on
        after_later = _draws()
        if course or more:
            hint(f"`rng_snapshot` ran the course's `{next(iter(course or more))}`: {WRITE_YOUR_OWN}")
        try:
            loaded = _saved_and_loaded(snapshot)
            loaded_later = _saved_and_loaded(later)
        except pickle.UnpicklingError as err:
            refused = str(err).split("GLOBAL ")[-1].split()[0] if "GLOBAL " in str(err) else "an object"
            advice = (
                "NumPy's state holds a NumPy array, which the weights-only loader does not accept; section 1 says "
                "how such a state is stored in a checkpoint"
                if "numpy" in refused
                else "store plain data: tensors, numbers, strings, lists, tuples and dicts"
            )
            hint(
                f"`torch.load(weights_only=True)` refuses your snapshot: {refused} is not on its allow-list. {advice}",
                S_SEED if "numpy" in refused else S_WEIGHTS_ONLY,
            )
        for attempt in range(2):  # restoring twice from one snapshot gives the same draws twice
            _seed_all(99 + attempt)
            _draws()  # the restarted program has drawn something
            with calls_to(*UNPICKLING) as unpickled, calls_to(*COURSE_RNG) as course:
                rng_restore(loaded)
            if unpickled:
                hint(
                    f"`rng_restore` ran `{UNPICKLING_LABELS.get(next(iter(unpickled)), next(iter(unpickled)))}` on "
                    f"the checkpoint's data: {NOT_PICKLE}",
                    S_WEIGHTS_ONLY,
                )
            if course:
                hint(f"`rng_restore` ran the course's `{next(iter(course))}`: {WRITE_YOUR_OWN}")
            got = _draws()
            if got == after_later:
                hint(
                    "restoring the first snapshot gave the draws that follow the second one: `rng_restore` must put "
                    "back the states held in the snapshot it is given, not ones kept in a variable (a checkpoint "
                    "is read by a new process)"
                )
            for name in expected:
                if got[name] == expected[name]:
                    continue
                if got[name] == start[name]:
                    hint(
                        f"{name} starts again from its seed: a seed marks the beginning of a stream, the state "
                        f"marks where it is now; save and restore the state ({HOW[name]})"
                    )
                hint(f"{name} draws differ after restoring: save and restore its state ({HOW[name]})")
        needed = torch.get_rng_state().numel() + 2 * 624  # torch's CPU state, and Mersenne Twister keys twice
        held = _numbers_in(loaded)
        expect(
            held >= needed,
            f"the snapshot holds only {held} number{'s' if held != 1 else ''}, fewer than the generators' states "
            f"(torch's CPU state alone is {torch.get_rng_state().numel()} bytes): the snapshot itself must hold the "
            "states, since the checkpoint is read by a new process, which has none of this one's variables",
        )
        _seed_all(7)
        rng_restore(loaded_later)
        expect(
            _draws() == after_later,
            "restoring the second snapshot did not give the draws that followed it: `rng_restore` must put back "
            "the states held in the snapshot it is given",
        )
    # This machine may have no GPU, so the draws cannot show a missing CUDA state: read the functions instead.
    for function, names, what in (
        (rng_snapshot, CUDA_READ, "reads"),
        (rng_restore, CUDA_WRITE, "puts back"),
    ):
        expect(
            refers_to(function, *names) is not None,
            f"`{function.__name__}` never {what} a GPU's state. The task asks for every GPU's state when CUDA is "
            "available: torch's CPU state does not include the GPUs', so a run resumed on a GPU machine would draw "
            "other Dropout masks and initialisations there. On a machine without CUDA the draws cannot show "
            f"this, so the check reads your functions; use {HOW['torch (CUDA)'].split(' (')[0]}, when "
            "`torch.cuda.is_available()`",
            S_SEED,
        )
