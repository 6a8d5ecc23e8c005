"""utils.ddp: the launch plumbing (common.py) in-process, and one real torchrun launch of notebook 08's hello."""

import sys
from pathlib import Path

import jupytext
import pytest
import torch
import torch.distributed as dist

from utils.ddp.common import choose_backend, distributed, env_int, report, save_result
from utils.launch import TorchrunError, leftover_processes, load_rank_results, run_torchrun
from utils.paths import SOURCES_DIR

reads_proc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="leftover check reads /proc")


def test_distributed_joins_and_always_destroys(monkeypatch, tmp_path):
    """distributed() joins the group torchrun describes (here: one process) and destroys it, even after an error."""
    from utils.launch import free_port

    for name, value in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }.items():
        monkeypatch.setenv(name, value)
    with distributed("cpu", timeout_s=30) as info:
        assert dist.is_initialized() and (info.rank, info.world_size, info.backend) == (0, 1, "gloo")
        assert info.device == torch.device("cpu") and info.restart_count == 0
        save_result(tmp_path, {"rank": info.rank})
    assert not dist.is_initialized()
    assert load_rank_results(tmp_path) == {0: {"rank": 0}}
    with pytest.raises(ZeroDivisionError), distributed("cpu", timeout_s=30):
        _ = 1 / 0
    assert not dist.is_initialized()
    with pytest.raises(TypeError, match="must be a dict"):
        save_result(tmp_path, [1])


def test_env_helpers_without_torchrun(monkeypatch, capfd):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(RuntimeError, match="start this script with torchrun"):
        env_int("LOCAL_RANK")
    monkeypatch.setenv("RANK", "3")
    report("hi")
    assert capfd.readouterr().out == "[rank 3] hi\n"
    assert choose_backend("cpu") == ("gloo", torch.device("cpu"))
    with pytest.raises(ValueError):
        choose_backend("gpu")


def hello_script(folder: Path) -> Path:
    """Notebook 08's smallest program (its ``%%writefile runs/hello.py`` cell), written into ``folder``."""
    nb = jupytext.read(SOURCES_DIR / "08_data_parallel_ddp.py")
    [cell] = [c for c in nb.cells if c.source.startswith("%%writefile runs/hello.py")]
    path = folder / "hello.py"
    path.write_text(cell.source.split("\n", 1)[1])
    return path


@reads_proc
def test_torchrun_end_to_end(tmp_path):
    """One real launch of notebook 08's hello: sorted rank lines, result files, a destroyed group, no process left."""
    result = run_torchrun(hello_script(tmp_path), nproc=2, args=["--device", "cpu", "--out", tmp_path], timeout=180)
    lines = result.rank_lines()
    assert [ln.split("]")[0] for ln in lines] == ["[rank 0"] * 4 + ["[rank 1"] * 4
    assert "[rank 1] all_reduce(rank+1)=3 all_gather(rank)=[0, 1] broadcast from 0=42" in lines
    res = load_rank_results(tmp_path)
    assert sorted(res) == [0, 1] and all(r["destroyed"] for r in res.values())
    assert leftover_processes([result.launch_id]) == []


@reads_proc
def test_torchrun_failure_reports_worker_error(tmp_path):
    """A worker that fails at once (bad argument): the error names the command and shows its stderr."""
    with pytest.raises(TorchrunError, match=r"(?s)exit status 1.*invalid choice: 'gpu'") as info:
        run_torchrun(hello_script(tmp_path), nproc=1, args=["--device", "gpu"], timeout=180)
    assert leftover_processes([info.value.result.launch_id]) == []
