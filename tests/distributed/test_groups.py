"""init_training_mesh, init_sequence_parallel + shard_sequence on 4 gloo ranks (SP 2 × DP 2), end to end through
lightning_attn_sp.

Each DP replica trains on its own sequence, sharded along T over its SP group; the per-rank outputs and input
gradients, put back together, must be the single-process op on that replica's full sequence.
"""

import pytest
import torch
import torch.distributed as dist

import lightning_attention as la
from lightning_attention.distributed import (
    data_parallel_mesh,
    init_sequence_parallel,
    init_training_mesh,
    lightning_attn_sp,
    shard_sequence,
)
from lightning_attention.utils.testing import assert_close
from tests.distributed._workers import spawn

SP_SIZE, WORLD_SIZE = 2, 4
B, T, H, K, V = 1, 45, 2, 16, 16  # odd T: the two slices differ (23 and 22 tokens)


def _inputs() -> dict:
    gen = torch.Generator().manual_seed(7)
    dp_size = WORLD_SIZE // SP_SIZE
    return {
        "q": torch.randn(dp_size, B, T, H, K, generator=gen),  # one batch per DP replica
        "k": torch.randn(dp_size, B, T, H, K, generator=gen) / K**0.5,
        "v": torch.randn(dp_size, B, T, H, V, generator=gen),
        "do": torch.randn(dp_size, B, T, H, V, generator=gen),
        "slope": torch.tensor([0.05, 0.7]),
    }


def _groups_job(rank: int, world_size: int, workdir) -> dict:
    try:  # checked before any (collective) new_group call, so every rank raises and none waits
        init_sequence_parallel(3)
        bad_size_error = None
    except ValueError as e:
        bad_size_error = str(e)
    sp_group, dp_group = init_sequence_parallel(SP_SIZE)
    # membership, checked by communicating over the groups: the sum of the global ranks of each group
    sums = []
    for group in (sp_group, dp_group):
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=group)
        sums.append(t.item())

    mesh = init_training_mesh(SP_SIZE)
    flat = data_parallel_mesh(mesh)
    mesh_layout = {
        "grid": mesh.mesh.tolist(), "names": mesh.mesh_dim_names, "flat": flat.mesh.tolist(),
        "sp_ranks": dist.get_process_group_ranks(mesh["sp"].get_group()),
        "dp_ranks": dist.get_process_group_ranks(mesh["dp"].get_group()),
        "flat_ranks": dist.get_process_group_ranks(flat.get_group()),
    }

    x = torch.load(workdir / "inputs.pt")
    replica = dist.get_rank(dp_group)  # which batch this SP group trains on
    q, k, v, do = (shard_sequence(x[n][replica], sp_group).clone() for n in ("q", "k", "v", "do"))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o, _ = lightning_attn_sp(q, k, v, x["slope"], group=sp_group)
    (o * do).sum().backward()
    return {
        "sp_ranks": dist.get_process_group_ranks(sp_group),
        "dp_ranks": dist.get_process_group_ranks(dp_group),
        "sums": sums,
        "bad_size_error": bad_size_error,
        "mesh": mesh_layout,
        "replica": replica,
        "sp_rank": dist.get_rank(sp_group),
        "o": o.detach(),
        "dq": q.grad,
        "dk": k.grad,
        "dv": v.grad,
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sp_dp")
    torch.save(_inputs(), workdir / "inputs.pt")
    return spawn(_groups_job, WORLD_SIZE, workdir)


def test_contiguous_sp_groups_and_strided_dp_groups(results):
    for rank, res in enumerate(results):
        sp = [rank - rank % SP_SIZE + i for i in range(SP_SIZE)]
        dp = list(range(rank % SP_SIZE, WORLD_SIZE, SP_SIZE))
        assert res["sp_ranks"] == sp, f"rank {rank}"
        assert res["dp_ranks"] == dp, f"rank {rank}"
        assert res["sums"] == [float(sum(sp)), float(sum(dp))], f"rank {rank}: all_reduce over the groups"
        assert res["sp_rank"] == rank % SP_SIZE and res["replica"] == rank // SP_SIZE
        assert "must divide the world size 4" in (res["bad_size_error"] or ""), f"rank {rank}"


def test_the_training_mesh_is_dp_by_sp_with_every_rank_on_its_flattened_dimension(results):
    for rank, res in enumerate(results):
        mesh = res["mesh"]
        assert mesh["grid"] == [[0, 1], [2, 3]] and mesh["names"] == ("dp", "sp")
        assert mesh["sp_ranks"] == res["sp_ranks"] and mesh["dp_ranks"] == res["dp_ranks"], f"rank {rank}"
        assert mesh["flat"] == [0, 1, 2, 3] and mesh["flat_ranks"] == [0, 1, 2, 3]


def test_sp_times_dp_matches_single_process(results):
    x = _inputs()
    for replica in range(WORLD_SIZE // SP_SIZE):
        q, k, v = (x[n][replica].double().requires_grad_() for n in ("q", "k", "v"))
        o, _ = la.lightning_attn(q, k, v, x["slope"])
        (o * x["do"][replica].double()).sum().backward()
        shards = [res for res in results if res["replica"] == replica]
        shards.sort(key=lambda res: res["sp_rank"])
        assert [s["o"].shape[1] for s in shards] == [23, 22]
        for name, ref in (("o", o), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
            got = torch.cat([s[name] for s in shards], dim=1)
            assert_close(f"replica {replica} {name}", got, ref.detach(), torch.float32)


def test_needs_an_initialised_default_group():
    for init in (init_sequence_parallel, init_training_mesh):
        with pytest.raises(RuntimeError, match="init_process_group"):
            init(2)
