import io
import os
import stat
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from utils.checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    checkpoint_name,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_rng_state_dict,
    rng_state_dict,
    save_checkpoint,
    unwrap_model,
)



@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors gain nothing from threads; on a busy 2-core machine they only add waiting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


_GEN = torch.Generator().manual_seed(1)
X = torch.randn(64, 4, generator=_GEN)
Y = torch.randn(64, 2, generator=_GEN)


def _make(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu")
    return model, opt, sched, scaler


def _train(model, opt, sched, scaler, start: int, stop: int) -> None:
    model.train()
    for _ in range(start, stop):
        idx = torch.randint(0, len(X), (16,))  # the global RNG picks the batch: its state matters
        loss = F.mse_loss(model(X[idx]), Y[idx]) + 0.0 * np.random.rand() + 0.0 * random.random()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()


def _draw():
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def _state_equal(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _truncate(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_round_trip_restores_everything(tmp_path):
    model, opt, sched, scaler = _make()
    _train(model, opt, sched, scaler, 0, 4)
    extra = {"loss": 0.25, "best": [1, 2.5, "x", None], "nested": {"t": torch.arange(3)}}
    path = save_checkpoint(tmp_path / "ck", model=model, optimizer=opt, scheduler=sched, scaler=scaler,
                           epoch=1, step=4, extra=extra)
    assert path == tmp_path / "ck" / "checkpoint_00000004.pt"
    after_save = _draw()
    _draw()

    model2, opt2, sched2, scaler2 = _make(seed=5)
    info = load_checkpoint(path, model=model2, optimizer=opt2, scheduler=sched2, scaler=scaler2)
    assert _draw() == after_save  # python, numpy and torch generators restored
    assert (info.path, info.epoch, info.step, info.skipped) == (path, 1, 4, [])
    assert info.extra["best"] == [1, 2.5, "x", None] and torch.equal(info.extra["nested"]["t"], torch.arange(3))
    assert _state_equal(model, model2)
    assert sched2.state_dict() == sched.state_dict() and scaler2.state_dict() == scaler.state_dict()
    o1, o2 = opt.state_dict(), opt2.state_dict()
    assert o1["param_groups"] == o2["param_groups"]
    for i in o1["state"]:
        assert all(torch.equal(o1["state"][i][k], o2["state"][i][k]) for k in o1["state"][i])


def test_file_is_plain_weights_only_data(tmp_path):
    model, opt, sched, scaler = _make()
    path = save_checkpoint(tmp_path / "last.pt", model=model, optimizer=opt, scheduler=sched, scaler=scaler)
    payload = torch.load(path, weights_only=True)  # no allow-listing needed
    assert payload["format"] == CHECKPOINT_FORMAT and payload["epoch"] is None
    assert list(payload["rng"]) == [0] and set(payload["rng"][0]) >= {"python", "numpy", "torch"}
    save_checkpoint(tmp_path / "last.pt", model=model, step=9)  # a file name is overwritten in place
    assert load_checkpoint(tmp_path / "last.pt", model=model).step == 9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_keep_last_prunes_oldest(tmp_path):
    model = _make()[0]
    (tmp_path / ".checkpoint_00000009.pt.abc.tmp").write_bytes(b"left by a killed save")
    for step in range(1, 6):
        save_checkpoint(tmp_path, model=model, step=step, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == [checkpoint_name(4), checkpoint_name(5)]
    assert latest_checkpoint(tmp_path) == tmp_path / checkpoint_name(5)
    assert latest_checkpoint(tmp_path / "missing") is None


def test_rollback_moves_newer_checkpoints_aside(tmp_path):
    model = _make()[0]
    for step in (100, 200, 300, 400):
        save_checkpoint(tmp_path, model=model, step=step)
    # step 400 went wrong: resume from 300 and go on; the first new save is step 310
    load_checkpoint(tmp_path / checkpoint_name(300), model=model)
    save_checkpoint(tmp_path, model=model, step=310, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == [checkpoint_name(300), checkpoint_name(310)]
    assert latest_checkpoint(tmp_path) == tmp_path / checkpoint_name(310)  # not the stale 400
    assert [p.name for p in list_checkpoints(tmp_path / "superseded")] == [checkpoint_name(400)]
    assert load_checkpoint(tmp_path / "superseded" / checkpoint_name(400), model=model).step == 400
    # saving the same number again overwrites it and moves nothing
    save_checkpoint(tmp_path, model=model, step=310)
    assert [p.name for p in list_checkpoints(tmp_path)] == [checkpoint_name(300), checkpoint_name(310)]
    # a file name (not a folder) never touches the numbered checkpoints
    save_checkpoint(tmp_path / "best.pt", model=model, step=5)
    assert latest_checkpoint(tmp_path) == tmp_path / checkpoint_name(310)


@pytest.mark.parametrize("keep", [0.5, 0.99, 0.0])
def test_truncated_file_error_names_the_file(tmp_path, keep):
    model = _make()[0]
    path = save_checkpoint(tmp_path, model=model, step=1)
    _truncate(path, keep)
    with pytest.raises(CheckpointError, match="truncated or corrupt") as info:
        load_checkpoint(path, model=model)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_flipped_byte_is_caught_by_checksum(tmp_path):
    model = _make()[0]
    path = save_checkpoint(tmp_path, model=model, step=1)
    data = bytearray(path.read_bytes())
    where = data.find(model[0].weight.detach().numpy().tobytes())
    assert where > 0
    data[where + 5] ^= 0x10  # torch.load alone would return a silently different weight
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum") as info:
        load_checkpoint(path, model=model)
    assert str(path) in str(info.value)
    damaged = _make(seed=3)[0]
    load_checkpoint(path, model=damaged, verify=False)  # without the check the damage goes unnoticed
    assert not torch.equal(damaged[0].weight, model[0].weight)
    assert torch.equal(damaged[4].weight, model[4].weight)


def test_fallback_to_previous_checkpoint(tmp_path):
    model, opt, sched, scaler = _make()
    for step in (1, 2, 3):
        _train(model, opt, sched, scaler, step - 1, step)
        save_checkpoint(tmp_path, model=model, optimizer=opt, step=step)
    newest = tmp_path / checkpoint_name(3)
    _truncate(newest)
    with pytest.raises(CheckpointError, match="fallback=True"):
        load_checkpoint(tmp_path, model=model)
    info = load_checkpoint(tmp_path, model=model, optimizer=opt, fallback=True)
    assert info.path == tmp_path / checkpoint_name(2) and info.step == 2
    assert [p for p, _ in info.skipped] == [newest] and str(newest) in info.skipped[0][1]
    assert load_checkpoint(newest, model=model, fallback=True).step == 2  # from a file name too
    _truncate(tmp_path / checkpoint_name(2))
    _truncate(tmp_path / checkpoint_name(1))
    with pytest.raises(CheckpointError, match="no usable checkpoint among 3") as err:
        load_checkpoint(tmp_path, model=model, fallback=True)
    assert all(str(tmp_path / checkpoint_name(n)) in str(err.value) for n in (1, 2, 3))


def test_exception_during_save_keeps_previous(tmp_path, monkeypatch):
    model, opt, sched, scaler = _make()
    save_checkpoint(tmp_path, model=model, optimizer=opt, step=1, keep_last=1)
    real_save = torch.save

    def half_then_fail(obj, f, *args, **kwargs):
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(torch, "save", half_then_fail)
    _train(model, opt, sched, scaler, 0, 1)
    with pytest.raises(OSError, match="simulated"):
        save_checkpoint(tmp_path, model=model, optimizer=opt, step=2, keep_last=1)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint_name(1)]  # no temp file left
    assert load_checkpoint(tmp_path, model=_make()[0], optimizer=_make()[1]).step == 1


def test_resume_is_bit_identical(tmp_path):
    reference = _make()
    _train(*reference, 0, 10)

    run = _make()
    _train(*run, 0, 4)
    save_checkpoint(tmp_path, model=run[0], optimizer=run[1], scheduler=run[2], scaler=run[3], step=4)
    _train(*run, 4, 6)  # work lost in the "crash"
    del run

    resumed = _make(seed=123)
    torch.manual_seed(999)  # a new process starts with other random states
    info = load_checkpoint(tmp_path, model=resumed[0], optimizer=resumed[1], scheduler=resumed[2],
                           scaler=resumed[3])
    _train(*resumed, info.step, 10)
    assert _state_equal(reference[0], resumed[0])

    # control: without the RNG states the dropout masks and batches differ
    unseeded = _make(seed=123)
    load_checkpoint(tmp_path, model=unseeded[0], optimizer=unseeded[1], scheduler=unseeded[2],
                    scaler=unseeded[3], restore_rng=False)
    _train(*unseeded, info.step, 10)
    assert not _state_equal(reference[0], unseeded[0])


def test_wrappers_are_unwrapped_and_strict_false_reports(tmp_path):
    model = _make()[0]
    path = save_checkpoint(tmp_path, model=nn.DataParallel(model), step=0)
    keys = torch.load(path, weights_only=True)["model"].keys()
    assert not any(k.startswith("module.") for k in keys)
    assert unwrap_model(nn.DataParallel(model)) is model
    load_checkpoint(path, model=nn.DataParallel(_make()[0]))  # and loads into a wrapped model
    bigger = nn.Sequential(*_make()[0], nn.Linear(2, 1))
    info = load_checkpoint(path, model=bigger, strict=False)
    assert info.missing_keys == ["5.weight", "5.bias"] and info.unexpected_keys == []


def test_foreign_file_and_missing_states(tmp_path):
    model, opt, _, _ = _make()
    plain = tmp_path / "plain.pt"
    torch.save(model.state_dict(), plain)
    with pytest.raises(CheckpointError, match="not a torch-course checkpoint"):
        load_checkpoint(plain, model=model)
    path = save_checkpoint(tmp_path / "ck", model=model, step=0)
    with pytest.raises(ValueError, match="no optimizer state") as err:
        load_checkpoint(path, model=model, optimizer=opt)
    assert not isinstance(err.value, CheckpointError)
    assert "load it without optimizer=" in str(err.value)
    wider = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 2))
    with pytest.raises(RuntimeError, match=r"checkpoint_00000000\.pt does not fit the model Sequential") as err:
        load_checkpoint(path, model=wider)
    assert "size mismatch" in str(err.value)  # load_state_dict's own message follows the file name
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "nope.pt", model=model)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path / "empty", model=model)


def test_rng_states_are_per_rank(tmp_path):
    model = _make()[0]
    path = save_checkpoint(tmp_path / "own", model=model, step=1)  # no process group: rank 0
    after_save = _draw()
    load_checkpoint(path, model=model, rank=0)
    assert _draw() == after_save
    before = rng_state_dict()
    with pytest.raises(ValueError, match=r"random states of rank\(s\) \[0\], not of rank 1"):
        load_checkpoint(path, model=model, rank=1)  # never rank 0's generators on rank 1
    load_rng_state_dict(before)
    probe = _draw()
    load_rng_state_dict(before)
    info = load_checkpoint(path, model=model, rank=1, restore_rng=False)  # the explicit way out
    assert info.step == 1 and _draw() == probe  # generators untouched

    # every rank's states gathered into one file: each rank gets its own back
    states = {}
    for r in range(3):
        random.seed(r), np.random.seed(r), torch.manual_seed(r)
        states[r] = rng_state_dict()
    expected = {}
    for r in range(3):
        load_rng_state_dict(states[r])
        expected[r] = _draw()
    path = save_checkpoint(tmp_path / "all", model=model, step=2, rng_states=states)
    assert sorted(torch.load(path, weights_only=True)["rng"]) == [0, 1, 2]
    for r in (2, 0, 1):
        load_checkpoint(path, model=model, rank=r)
        assert _draw() == expected[r]
    with pytest.raises(ValueError, match="not of rank 3"):
        load_checkpoint(path, model=model, rank=3)

    # the rank a process saves under can be given explicitly
    path = save_checkpoint(tmp_path / "r2", model=model, step=3, rank=2)
    assert list(torch.load(path, weights_only=True)["rng"]) == [2]
    with pytest.raises(ValueError, match="not of rank 0"):
        load_checkpoint(path, model=model)
    with pytest.raises(ValueError, match="not both"):
        save_checkpoint(tmp_path / "x", model=model, step=1, rank=0, rng_states=states)
    with pytest.raises(ValueError, match=r"rng_states\[1\] lacks"):
        save_checkpoint(tmp_path / "x", model=model, step=1, rng_states={1: {"python": 1}})
    with pytest.raises(TypeError, match="rng_states must be"):
        save_checkpoint(tmp_path / "x", model=model, step=1, rng_states={})


def test_version_1_file_is_read_as_rank_0(tmp_path):
    model = _make()[0]
    path = save_checkpoint(tmp_path, model=model, step=1)
    payload = torch.load(path, weights_only=True)
    payload["version"], payload["rng"] = 1, payload["rng"][0]  # the old layout: one state
    torch.save(payload, path)
    after_save = _draw()
    load_checkpoint(path, model=model)
    assert _draw() == after_save
    with pytest.raises(ValueError, match="not of rank 1"):
        load_checkpoint(path, model=model, rank=1)


def test_rng_state_helpers():
    state = rng_state_dict()
    first = _draw()
    load_rng_state_dict(state)
    assert _draw() == first
    with pytest.raises(ValueError, match="lacks"):
        load_rng_state_dict({"python": state["python"]})
    with pytest.raises(TypeError):
        load_rng_state_dict([1, 2])


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"model": "not a model", "step": 1}, TypeError, "model must be"),
        ({"optimizer": object(), "step": 1}, TypeError, "optimizer must be"),
        ({"scheduler": object(), "step": 1}, TypeError, "scheduler must have"),
        ({"scaler": 1.0, "step": 1}, TypeError, "scaler must be"),
        ({"step": -1}, ValueError, "step must be >= 0"),
        ({"step": "3"}, TypeError, "step must be an int"),
        ({"epoch": True}, TypeError, "epoch must be an int"),
        ({"step": 1, "keep_last": 0}, ValueError, "keep_last must be >= 1"),
        ({"step": 1, "rank": -1}, ValueError, "rank must be >= 0"),
        ({"step": 1, "extra": {"a": np.zeros(2)}}, TypeError, r"extra\['a'\] is a ndarray"),
        ({"step": 1, "extra": [1]}, TypeError, "extra must be a dict"),
        ({}, ValueError, "needs step= or epoch="),
    ],
)
def test_bad_save_arguments(tmp_path, kwargs, error, match):
    kwargs = {"model": nn.Linear(2, 2), **kwargs}
    with pytest.raises(error, match=match):
        save_checkpoint(tmp_path / "ck", **kwargs)
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").iterdir())


def test_bad_path_and_load_arguments(tmp_path):
    model = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="path must be"):
        save_checkpoint(3, model=model, step=1)
    with pytest.raises(ValueError, match="keep_last needs a folder"):
        save_checkpoint(tmp_path / "one.pt", model=model, keep_last=2)
    path = save_checkpoint(tmp_path, model=model, step=1)
    with pytest.raises(TypeError, match="fallback must be a bool"):
        load_checkpoint(path, model=model, fallback="yes")
    with pytest.raises(TypeError, match="verify must be a bool"):
        load_checkpoint(path, model=model, verify=1)
    with pytest.raises(TypeError, match="model must be"):
        load_checkpoint(path, model=None)
    with pytest.raises(NotADirectoryError):
        list_checkpoints(path)


def test_atomic_torch_save_round_trip_and_failure(tmp_path, monkeypatch):
    from utils.checkpoint import atomic_torch_save

    target = atomic_torch_save({"x": torch.arange(3)}, tmp_path / "sub" / "obj.pt")
    assert torch.equal(torch.load(target, weights_only=True)["x"], torch.arange(3))

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"half")
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        atomic_torch_save({"x": torch.zeros(3)}, target)
    monkeypatch.undo()
    assert torch.equal(torch.load(target, weights_only=True)["x"], torch.arange(3))
    assert sorted(p.name for p in target.parent.iterdir()) == ["obj.pt"]
    with pytest.raises(TypeError, match="target"):
        atomic_torch_save({}, 3)  # type: ignore[arg-type]


@pytest.mark.parametrize("broken", ["open", "fsync"])
def test_folder_fsync_refused_does_not_fail_the_save(tmp_path, monkeypatch, broken):
    """Windows cannot open a folder; some network/FUSE filesystems reject fsync on one."""
    from utils import checkpoint as ck

    real_open, real_fsync = os.open, os.fsync

    def refusing_open(path, flags, *args, **kwargs):
        if os.path.isdir(path):
            raise PermissionError(13, "Permission denied (simulated Windows)")
        return real_open(path, flags, *args, **kwargs)

    def refusing_fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(22, "Invalid argument (simulated network filesystem)")
        return real_fsync(fd)

    if broken == "open":
        monkeypatch.setattr(ck.os, "open", refusing_open)
    else:
        monkeypatch.setattr(ck.os, "fsync", refusing_fsync)
    path = save_checkpoint(tmp_path, model=nn.Linear(2, 2), step=1)
    monkeypatch.undo()
    assert load_checkpoint(path, model=nn.Linear(2, 2)).step == 1
