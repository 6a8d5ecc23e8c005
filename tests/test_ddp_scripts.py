"""utils.ddp: the pure parts in-process, and one real torchrun launch end to end (about 10 s of the suite)."""

import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from utils.ddp.common import choose_backend, env_int, report
from utils.ddp.ring_allreduce import chunk_slices, ring_schedule, simulate_ring
from utils.ddp.syncbn import HandSyncBatchNorm, SyncBatchNormFunction
from utils.ddp.train import ToyModel, make_data
from utils.launch import TorchrunError, leftover_processes, load_rank_results, run_torchrun


def test_chunk_slices_cover_evenly():
    sizes = [s.stop - s.start for s in chunk_slices(10, 4)]
    assert sizes == [3, 3, 2, 2]
    assert [s.stop - s.start for s in chunk_slices(2, 4)] == [1, 1, 0, 0]
    with pytest.raises(ValueError):
        chunk_slices(4, 0)


def test_ring_schedule_matches_the_notes():
    # machine 1 (rank 0) first sends its chunk 0 and receives chunk 3 from machine 4
    assert ring_schedule(0, 4)[0] == ("scatter-reduce", 0, 3)
    assert len(ring_schedule(2, 5)) == 8
    with pytest.raises(ValueError):
        ring_schedule(4, 4)


@pytest.mark.parametrize(("n", "length"), [(1, 3), (2, 5), (4, 4), (5, 3), (7, 20)])
def test_simulated_ring_sums_and_counts(n, length):
    gen = torch.Generator().manual_seed(n)
    vectors = torch.randint(-50, 50, (n, length), generator=gen).double().tolist()
    result, counts = simulate_ring(vectors)
    total = torch.tensor(vectors).sum(0).tolist()
    assert all(v == total for v in result)
    assert all(c.sent_messages == c.recv_messages == 2 * (n - 1) for c in counts)
    if length % n == 0:
        assert all(c.sent_numbers == 2 * (n - 1) * length // n for c in counts)


@pytest.fixture
def single_process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_hand_syncbn_gradcheck_and_batchnorm(single_process_group):
    x = torch.randn(6, 3, 4, dtype=torch.double, requires_grad=True)
    w = torch.randn(3, dtype=torch.double, requires_grad=True)
    b = torch.randn(3, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: SyncBatchNormFunction.apply(*t, 1e-5)[0], (x, w, b))
    bn = HandSyncBatchNorm(3).double()
    ref = torch.nn.BatchNorm1d(3).double()
    torch.testing.assert_close(bn(x), ref(x))
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)
    bn.eval()
    ref.eval()
    torch.testing.assert_close(bn(x), ref(x))
    assert set(bn.state_dict()) == set(ref.state_dict())


def test_hand_syncbn_without_group_is_batchnorm_and_checks_shape():
    bn = HandSyncBatchNorm(2)
    x = torch.randn(5, 2)
    torch.testing.assert_close(bn(x), F.batch_norm(x, None, None, training=True))
    with pytest.raises(ValueError, match="expected input"):
        bn(torch.randn(5, 3))
    with pytest.raises(ValueError):
        HandSyncBatchNorm(0)


def test_data_and_model_are_deterministic():
    assert torch.equal(make_data(8, seed=1)[0], make_data(8, seed=1)[0])
    assert ToyModel()(torch.randn(4, 10)).shape == (4, 5)


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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="leftover check reads /proc")
def test_torchrun_end_to_end(tmp_path):
    """One real launch: sorted rank lines, result files, a destroyed group and no process left."""
    result = run_torchrun("utils.ddp.hello", nproc=2, args=["--device", "cpu", "--out", tmp_path], timeout=180)
    lines = result.rank_lines()
    assert [ln.split("]")[0] for ln in lines] == ["[rank 0"] * 4 + ["[rank 1"] * 4
    assert "[rank 1] all_reduce(rank+1)=3 all_gather(rank)=[0, 1] broadcast from 0=42" in lines
    res = load_rank_results(tmp_path)
    assert sorted(res) == [0, 1] and all(r["destroyed"] for r in res.values())
    assert leftover_processes([result.launch_id]) == []


def test_torchrun_failure_reports_worker_error():
    """A worker that fails at once (bad argument): the error names the command and shows its stderr."""
    with pytest.raises(TorchrunError, match=r"(?s)exit status 1.*invalid choice: 'gpu'") as info:
        run_torchrun("utils.ddp.hello", nproc=1, args=["--device", "gpu"], timeout=180)
    assert leftover_processes([info.value.result.launch_id]) == []
