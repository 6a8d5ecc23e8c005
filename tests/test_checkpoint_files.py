import errno
import io
import os
import random
import stat
import struct
import warnings
import zipfile

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from utils.checkpoint_files import (
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
    path = save_checkpoint(
        tmp_path / "ck", model=model, optimizer=opt, scheduler=sched, scaler=scaler, epoch=1, step=4, extra=extra
    )
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
    info = load_checkpoint(tmp_path, model=resumed[0], optimizer=resumed[1], scheduler=resumed[2], scaler=resumed[3])
    _train(*resumed, info.step, 10)
    assert _state_equal(reference[0], resumed[0])

    # control: without the RNG states the dropout masks and batches differ
    unseeded = _make(seed=123)
    load_checkpoint(
        tmp_path, model=unseeded[0], optimizer=unseeded[1], scheduler=unseeded[2], scaler=unseeded[3], restore_rng=False
    )
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


@pytest.mark.parametrize(("version", "advice"), [(1, "older version of the course"), (4, "newer version")])
def test_a_file_of_another_format_is_refused_and_left_as_it_is(tmp_path, version, advice):
    model = _make()[0]
    path = save_checkpoint(tmp_path, model=model, step=1)
    payload = torch.load(path, weights_only=True)
    payload["version"] = version
    torch.save(payload, path)
    before = path.read_bytes()
    with pytest.raises(CheckpointError, match=f"format version {version}; this code reads version 3 only: .*{advice}"):
        load_checkpoint(path, model=model)
    assert path.read_bytes() == before


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
    from utils.checkpoint_files import atomic_torch_save

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
    from utils import checkpoint_files as ck

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


# --------------------------------------------------------------------------- hardening (issue 14)


def _records(data: bytes):
    """``(name, first byte, size)`` of each record's bytes in a zip file."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for info in zf.infolist():
            name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
            yield info.filename, info.header_offset + 30 + name_len + extra_len, info.compress_size


def test_every_flipped_byte_is_refused_and_fallback_skips_it(tmp_path):
    """One changed byte anywhere in a checkpoint: CheckpointError naming the file, never a load.

    Stricter than "an error or bit-identical values": the SHA-256 at the end of the file covers every
    other byte (padding included) and itself, so no byte is harmless. Every byte of the zip structure
    (headers, central directory, end record, comment) and of the small records is flipped; of the three
    records over 1 KB (the 4.5 KB pickle, mostly Python's random state, and the two 5 KB random-state
    tensors), every 16th byte, which keeps the test under a second.
    """
    model = nn.Linear(2, 1)
    older = save_checkpoint(tmp_path, model=model, step=1)
    path = save_checkpoint(tmp_path, model=model, step=2)
    good = path.read_bytes()
    bulk = {i for _, start, size in _records(good) if size > 1024 for i in range(start, start + size)}
    positions = [i for i in range(len(good)) if i not in bulk or i % 16 == 0]
    assert len(bulk) > len(good) // 2 and len(positions) > 2000
    wrong = []
    with open(path, "r+b") as f:
        for i in positions:  # flip one bit in place, load, put it back: rewriting the file each time is slower
            f.seek(i)
            f.write(bytes([good[i] ^ 1 << (i % 8)]))
            f.flush()
            try:
                load_checkpoint(path, model=model, restore_rng=False)
                wrong.append((i, "loaded"))
            except CheckpointError as err:
                if str(path) not in str(err):
                    wrong.append((i, str(err)))
            except Exception as err:  # noqa: BLE001 - any other type is the failure this test looks for
                wrong.append((i, f"{type(err).__name__}: {err}"))
            f.seek(i)
            f.write(good[i : i + 1])
    assert path.read_bytes() == good
    assert not wrong, f"{len(wrong)} of {len(positions)} flips: {wrong[:5]}"

    directory = good.rfind(b"PK\x01\x02")  # the last central directory entry: what CRCs do not cover
    for i in (10, directory + 6, directory + 20, len(good) - 90, len(good) - 1):
        damaged = bytearray(good)
        damaged[i] ^= 0x10
        path.write_bytes(damaged)
        info = load_checkpoint(tmp_path, model=nn.Linear(2, 1), fallback=True)
        assert info.path == older and [p for p, _ in info.skipped] == [path]


def _snapshot(model, opt):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        {i: {k: v.clone() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()},
        rng_state_dict(),
    )


def _assert_unchanged(model, opt, snapshot):
    weights, opt_state, rng = snapshot
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    now = opt.state_dict()["state"]
    assert now.keys() == opt_state.keys()
    assert all(torch.equal(now[i][k], v) for i in opt_state for k, v in opt_state[i].items())
    probe = _draw()
    load_rng_state_dict(rng)
    assert _draw() == probe


def _wider_head():
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 3))


@pytest.mark.parametrize(
    "case",
    [
        "size mismatch",
        "another optimizer class",
        "optimizer over other parameters",
        "bad RNG record",
        "RNG record lacks numpy",
    ],
)
def test_failed_load_changes_nothing(tmp_path, case):
    from utils.checkpoint_files import atomic_torch_save

    model, opt, sched, scaler = _make()
    _train(model, opt, sched, scaler, 0, 2)
    path = save_checkpoint(tmp_path, model=model, optimizer=opt, step=2)
    target, target_opt, target_sched, target_scaler = _make(seed=5)
    _train(target, target_opt, target_sched, target_scaler, 0, 1)  # what is about to be overwritten has state too
    error, match = ValueError, None
    if case == "size mismatch":  # the first layers fit, the last does not
        target = _wider_head()
        target_opt = torch.optim.AdamW(target.parameters(), lr=0.05)
        error, match = RuntimeError, r"size mismatch for 4\.weight"
    elif case == "another optimizer class":
        target_opt = torch.optim.SGD(target.parameters(), lr=0.1, momentum=0.9)
        match = "saved with the optimizer AdamW, but optimizer= is an instance of SGD"
    elif case == "optimizer over other parameters":
        target_opt = torch.optim.AdamW(list(target.parameters())[:2], lr=0.05)
        match = "parameter group"
    else:
        payload = torch.load(path, weights_only=True)
        if case == "bad RNG record":
            payload["rng"][0]["torch"] = torch.zeros(7, dtype=torch.uint8)
        else:
            del payload["rng"][0]["numpy"]
        atomic_torch_save(payload, path)
        error, match = CheckpointError, "random state"
    before = _snapshot(target, target_opt)
    with pytest.raises(error, match=match) as err:
        load_checkpoint(path, model=target, optimizer=target_opt)
    assert str(path) in str(err.value)
    _assert_unchanged(target, target_opt, before)


def test_stale_temporaries_are_removed(tmp_path):
    import fcntl

    model = nn.Linear(2, 1)
    save_checkpoint(tmp_path, model=model, step=1)
    dead = tmp_path / ".checkpoint_00000002.pt.k3x9a0zq.tmp"  # a save of step 2 killed with SIGKILL
    dead.write_bytes(b"x" * 1000)
    alive = tmp_path / ".checkpoint_00000003.pt.0b1c2d3e.tmp"  # a writer in another process, still writing
    alive.write_bytes(b"y" * 1000)
    foreign = [tmp_path / ".tmp-abc", tmp_path / ".notes.tmp", tmp_path / ".other.pt.abcdefgh.tmp"]
    for path in foreign:
        path.write_bytes(b"not ours")
    with open(alive, "r+b") as writer:
        fcntl.flock(writer, fcntl.LOCK_EX)  # what the writing process holds until its rename
        save_checkpoint(tmp_path, model=model, step=4)
        assert not dead.exists() and alive.exists() and all(p.exists() for p in foreign)
    save_checkpoint(tmp_path, model=model, step=5)  # the writer died: its lock went with it
    assert not alive.exists()
    # a file name (not a folder) cleans the temporaries of that name only
    (tmp_path / ".last.pt.a1b2c3d4.tmp").write_bytes(b"z")
    save_checkpoint(tmp_path / "last.pt", model=model, step=6)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == [
        ".notes.tmp",
        ".other.pt.abcdefgh.tmp",
    ]


def test_writer_whose_temporary_was_taken_for_abandoned_starts_again(tmp_path, monkeypatch):
    """A cleaner may lock and delete a temporary file between its creation and its writer's lock."""
    import fcntl
    import types

    from utils import checkpoint_files as ck

    raced = []

    def cleaner_got_there_first(fd, operation):
        if not raced and operation == fcntl.LOCK_EX:
            raced.extend(p.name for p in tmp_path.glob(".*.tmp"))
            for temporary in tmp_path.glob(".*.tmp"):
                temporary.unlink()
        return fcntl.flock(fd, operation)

    monkeypatch.setattr(
        ck, "fcntl", types.SimpleNamespace(flock=cleaner_got_there_first, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB)
    )
    path = save_checkpoint(tmp_path, model=nn.Linear(2, 1), step=1)
    assert len(raced) == 1 and sorted(p.name for p in tmp_path.iterdir()) == [checkpoint_name(1)]
    assert load_checkpoint(path, model=nn.Linear(2, 1)).step == 1


def test_without_flock_old_temporaries_are_removed(tmp_path, monkeypatch):
    """Windows has no fcntl: there an unlocked temporary file counts as abandoned after an hour."""
    import time

    from utils import checkpoint_files as ck

    monkeypatch.setattr(ck, "fcntl", None)
    old, fresh = tmp_path / ".checkpoint_00000001.pt.aaaaaaaa.tmp", tmp_path / ".checkpoint_00000002.pt.bbbbbbbb.tmp"
    for path in (old, fresh):
        path.write_bytes(b"left by a killed save")
    hours_ago = time.time() - 2 * ck.STALE_TEMP_SECONDS
    os.utime(old, (hours_ago, hours_ago))
    path = save_checkpoint(tmp_path, model=nn.Linear(2, 1), step=3)
    assert not old.exists() and fresh.exists()
    assert load_checkpoint(path, model=nn.Linear(2, 1)).step == 3


class _FullDisk(io.RawIOBase):
    """A file that accepts ``room`` bytes and then fails as a full disk does (ENOSPC)."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def writable(self):
        return True

    def write(self, b):
        if len(b) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(b)
        return self.f.write(b)


def test_full_disk_names_the_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    model = nn.Linear(2, 1)
    save_checkpoint(tmp_path, model=model, step=1)
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: real_save(obj, _FullDisk(f, 5000), *a, **k))
    with pytest.raises(OSError) as err:
        save_checkpoint(tmp_path, model=model, step=2)
    monkeypatch.undo()
    assert err.value.errno == errno.ENOSPC
    assert "no space left" in str(err.value) and str(tmp_path / checkpoint_name(2)) in str(err.value)
    assert "unexpected pos" in str(err.value.__cause__)  # torch's own message stays reachable
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint_name(1)]


def test_file_size_limit_is_named(tmp_path):
    """The real kernel path: beyond RLIMIT_FSIZE a write fails with EFBIG (Python ignores SIGXFSZ)."""
    import resource
    import signal

    if signal.getsignal(signal.SIGXFSZ) != signal.SIG_IGN:
        pytest.skip("SIGXFSZ is not ignored in this process")
    big = nn.Linear(200, 200)  # 160 KB of weights
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        with pytest.raises(OSError) as err:
            save_checkpoint(tmp_path, model=big, step=1)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert err.value.errno == errno.EFBIG and "file size limit" in str(err.value)
    assert str(tmp_path / checkpoint_name(1)) in str(err.value) and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fallback", [False, True])
def test_load_lists_again_when_the_newest_is_pruned(tmp_path, monkeypatch, fallback):
    from utils import checkpoint_files as ck

    model = nn.Linear(2, 1)
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, model=model, step=step)
    real_list = ck.list_checkpoints
    pruned = []

    def trainer_prunes_after_listing(folder):
        found = real_list(folder)
        if not pruned:  # between the reader's listing and its open, the trainer saves step 4, keeping 1
            pruned.append(True)
            save_checkpoint(tmp_path, model=model, step=4, keep_last=1)
        return found

    monkeypatch.setattr(ck, "list_checkpoints", trainer_prunes_after_listing)
    info = load_checkpoint(tmp_path, model=nn.Linear(2, 1), fallback=fallback)
    assert pruned and info.step == 4 and info.skipped == []


@pytest.mark.parametrize("umask, mode", [(0o077, 0o600), (0o022, 0o644)], ids=["umask 077", "umask 022"])
def test_file_mode_follows_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        path = save_checkpoint(tmp_path, model=nn.Linear(2, 1), step=1)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode


class _Booby:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (io.open, (self.marker, "w"))


def test_malicious_pickle_refused_even_when_the_environment_asks_for_unsafe_loads(tmp_path, monkeypatch):
    model = nn.Linear(2, 1)
    path = save_checkpoint(tmp_path, model=model, step=1)
    payload = torch.load(path, weights_only=True)
    marker = tmp_path / "code_ran"
    payload["extra"] = {"bonus": _Booby(str(marker))}
    torch.save(payload, path)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # makes the *default* weights_only False
    with pytest.raises(CheckpointError, match="UnpicklingError"):
        load_checkpoint(path, model=model)
    assert not marker.exists()


def test_files_written_without_crc_load(tmp_path):
    model = nn.Linear(2, 1)
    path = save_checkpoint(tmp_path, model=model, step=1)
    payload = torch.load(path, weights_only=True)
    torch.serialization.set_crc32_options(False)
    try:
        plain = tmp_path / "plain_torch_save.pt"
        torch.save(payload, plain)  # a course payload written by torch.save: no SHA-256 at its end
        ours = save_checkpoint(tmp_path, model=model, step=2)
    finally:
        torch.serialization.set_crc32_options(True)
    for written in (plain, ours):
        with zipfile.ZipFile(written) as zf:
            assert {info.CRC for info in zf.infolist()} == {0}  # what "CRC off" stores: zeros
        assert load_checkpoint(written, model=model).step in (1, 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_map_location_of_a_missing_device_gets_the_right_advice(tmp_path):
    model = nn.Linear(2, 1)
    for step in (1, 2):
        save_checkpoint(tmp_path, model=model, step=step)
    with pytest.raises(ValueError, match=r"map_location='cuda'.*map_location='cpu'") as err:
        load_checkpoint(tmp_path, model=model, map_location="cuda")
    assert "fallback" not in str(err.value) and not isinstance(err.value, CheckpointError)


def test_module_prefix_in_a_course_file_is_hinted(tmp_path):
    from utils.checkpoint_files import atomic_torch_save

    model = nn.Linear(2, 1)
    path = save_checkpoint(tmp_path, model=model, step=1)
    payload = torch.load(path, weights_only=True)
    payload["model"] = nn.DataParallel(model).state_dict()  # written by hand from a wrapped model
    atomic_torch_save(payload, path)
    with pytest.raises(RuntimeError, match=r"start with 'module\.'") as err:
        load_checkpoint(path, model=nn.Linear(2, 1))
    assert "consume_prefix_in_state_dict_if_present" in str(err.value) and "notebook 06" in str(err.value)


def _rewrite_version(path, version: int) -> None:
    payload = torch.load(path, weights_only=True)
    payload["version"] = version
    torch.save(payload, path)


def test_ck4_a_newer_checkpoint_is_refused_with_update_advice_and_never_replaced(tmp_path):
    """Probe CK4: a checkpoint of a newer format (a newer course wrote it) is not damage. The error says to update
    the course (no fallback advice), fallback=True does not skip it, and no save replaces, moves or prunes it."""
    from utils.checkpoint_files import NewerCheckpointError

    model = _make()[0]
    save_checkpoint(tmp_path, model=model, step=1)
    newer = save_checkpoint(tmp_path, model=model, step=2)
    _rewrite_version(newer, 4)
    before = newer.read_bytes()
    for fallback in (False, True):
        with pytest.raises(NewerCheckpointError, match="newer version of the course.*Update this copy") as info:
            load_checkpoint(tmp_path, model=model, fallback=fallback)
        assert "fallback" not in str(info.value)
    for step, keep_last in ((2, None), (1, None), (0, None), (3, 1)):
        with pytest.raises(NewerCheckpointError, match=f"saves into {tmp_path} that would replace"):
            save_checkpoint(tmp_path, model=model, step=step, keep_last=keep_last)
    assert newer.read_bytes() == before and not (tmp_path / "superseded").exists()
    save_checkpoint(tmp_path, model=model, step=3)  # touches nothing of the newer course: allowed
    assert newer.read_bytes() == before
    last = save_checkpoint(tmp_path / "last.pt", model=model, step=3)
    _rewrite_version(last, 4)
    with pytest.raises(NewerCheckpointError, match="last.pt has format version 4"):
        save_checkpoint(last, model=model, step=4)


def test_ck1_two_writers_in_one_folder_are_named_and_superseded_stays_bounded(tmp_path):
    """Probe CK1: two writers saving the same steps into one folder (every DDP rank, without `if rank == 0`) roll
    each other back. A warning names the folder, and keep_last bounds superseded/ as it bounds the folder."""
    model = _make()[0]
    save_checkpoint(tmp_path, model=model, step=4, keep_last=2)
    other = save_checkpoint(tmp_path / "elsewhere", model=model, step=6)  # "another process" writes step 6 later
    os.replace(other, tmp_path / other.name)
    later = (tmp_path / checkpoint_name(4)).stat().st_mtime_ns + 10**9
    os.utime(tmp_path / other.name, ns=(later, later))
    with pytest.warns(UserWarning, match=f"another process is saving into {tmp_path} too"):
        save_checkpoint(tmp_path, model=model, step=5, keep_last=2)
    for step in range(6, 30):  # a legitimate rollback by this process itself does not warn
        save_checkpoint(tmp_path, model=model, step=step, keep_last=2)
        if step % 3 == 0:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                save_checkpoint(tmp_path, model=model, step=step - 1, keep_last=2)
    assert len(list_checkpoints(tmp_path / "superseded")) <= 2


def test_ck5_a_read_only_folder_is_named_with_the_fix(tmp_path, monkeypatch):
    """Probe CK5: saving into a folder that cannot be written names the folder (not the hidden temporary file)
    and says what to do; loading from it works."""
    model = _make()[0]
    path = save_checkpoint(tmp_path, model=model, step=1)
    real_open = os.open

    def read_only(file, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), file)
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(OSError, match=f"the folder {tmp_path} is on a read-only filesystem.*save into a folder") as e:
        save_checkpoint(tmp_path, model=model, step=2)
    assert ".tmp" not in str(e.value) and e.value.errno == errno.EROFS
    monkeypatch.undo()
    assert load_checkpoint(tmp_path, model=model).path == path
