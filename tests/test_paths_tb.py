import importlib.util

import pytest
import torch
from torch.utils.tensorboard import SummaryWriter

from utils import REPO_ROOT, paths, relpath
from utils.tb import read_events


def test_paths_find_the_checkout_from_any_working_directory(tmp_path, monkeypatch):
    """utils/paths.py run afresh from another folder (as a notebook or torchrun script is): same folders."""
    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location("fresh_paths", paths.__file__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    assert (fresh.DATA_DIR / "SHA256SUMS").is_file() and (fresh.DATA_DIR / "mnist").is_dir()
    assert (fresh.NOTEBOOKS_DIR / "01_tensors.ipynb").is_file() and (fresh.SOURCES_DIR / "01_tensors.py").is_file()
    assert fresh.relpath(fresh.DATA_DIR / "mnist") == "data/mnist"


def test_relpath_inside_and_outside(tmp_path):
    assert relpath(REPO_ROOT / "data" / "x.txt") == "data/x.txt"
    assert relpath(str(REPO_ROOT)) == "."
    assert relpath(tmp_path) == tmp_path.resolve().as_posix()
    with pytest.raises(TypeError, match="os.PathLike"):
        relpath(3)  # type: ignore[arg-type]


def test_read_events_round_trip(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        for step in range(3):
            writer.add_scalar("loss", 1.0 / (step + 1), step)
        writer.add_image("digits", torch.rand(3, 8, 8), 0)
        writer.add_hparams({"lr": 0.1}, {"hp/acc": 0.5}, run_name=".")
        with pytest.warns(FutureWarning, match=r"jit\.trace"):  # add_graph traces; tracing is deprecated
            writer.add_graph(torch.nn.Linear(2, 3), torch.randn(1, 2))
    summary = read_events(tmp_path)
    assert [s for s, _ in summary.scalars["loss"]] == [0, 1, 2]
    assert summary.scalars["loss"][1][1] == pytest.approx(0.5)
    assert summary.images == {"digits": 1}
    assert summary.graph_nodes > 0
    assert "_hparams_/experiment" in summary.hparams


def test_read_events_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_events(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no TensorBoard event file"):
        read_events(tmp_path)
