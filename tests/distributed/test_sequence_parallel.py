"""lightning_attn_sp on CPU ranks (gloo) against the single-process op on the full sequence.

One spawn of 3 ranks runs every case (process start-up dominates the cost): 2-rank cases on a subgroup, 3-rank
cases on the default group; each case is then checked by its own test. The reference is the public
``lightning_attn`` on the full sequence, in float64 from the same rounded inputs, so each case is held to the
tolerance of its input dtype (lightning_attention/utils/testing.py). Loss on rank r:
``(o_r·do_r).sum() + (final·dht_r).sum()`` with ``Σ_r dht_r = dht``: the gradients that reach the replicated final
state from several ranks must add up to the single-process gradient of ``(final·dht).sum()``.
"""

import dataclasses
import json
import os
import subprocess
import sys
import zlib

import pytest
import torch

import lightning_attention as la
from lightning_attention import settings
from lightning_attention.distributed import (
    lightning_attn_sp,
    record_communication,
    sequence_bounds,
    shard_sequence,
    sp_communication_bytes,
)
from lightning_attention.distributed.call_header import HEADER_BYTES
from lightning_attention.utils.testing import assert_close, tolerance
from tests.distributed._workers import spawn

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    lengths: tuple[int, ...]  # slice length of each rank, in rank order; the world size is len(lengths)
    batch: int
    heads: int
    dim_k: int
    dim_v: int
    slope: tuple[float, ...] | None  # None: no decay
    dtype: torch.dtype = torch.float32
    scale: float = 1.0
    initial_state: bool = True
    h0_requires_grad: bool = True  # with initial_state: whether h0 is a leaf that asks for its gradient
    output_final_state: bool = True


CASES = [
    # a long slice then a 3-token one; no decay, where the state only grows
    Case("w2_nodecay", (70, 3), batch=2, heads=2, dim_k=16, dim_v=32, slope=None),
    # mixed decay: no decay, weak, strong; K != V; no h0 and no final state (the backward gathers dS_in only)
    Case("w2_mixed_nostate", (33, 40), 1, 3, 32, 16, (0.0, 0.05, 1.5), initial_state=False, output_final_state=False),
    # bfloat16 inputs against float64: the bf16 tolerance
    Case("w2_mixed_bf16", (5, 64), 1, 2, 32, 32, (0.02, 0.4), dtype=torch.bfloat16, scale=0.5),
    # three ranks, a 2-token middle slice, every decay regime, odd sizes
    Case("w3_mixed", (40, 2, 57), 1, 4, 32, 48, (0.0, 0.01, 0.3, 3.0), scale=0.7),
    # an empty middle slice: its state passes h0's decay through unchanged (λ^0 = 1)
    Case("w3_empty_middle", (30, 0, 25), 2, 2, 16, 16, None),
    # an empty first slice without a final state: rank 0's loss sees only an empty o and must still join backward
    Case("w3_empty_first", (0, 31, 20), 1, 2, 16, 32, (0.1, 1.0), output_final_state=False),
    # empty slices whose exchange has no h0 requiring grad: their backward must still join the all-gather
    Case("w2_empty_first_no_state", (0, 17), 1, 2, 16, 16, (0.2, 0.0), initial_state=False, output_final_state=False),
    Case("w3_empty_first_no_h0", (0, 31, 20), 1, 2, 16, 32, (0.1, 1.0), initial_state=False),
    Case("w3_empty_last_frozen_h0", (25, 30, 0), 2, 2, 16, 16, None, h0_requires_grad=False),
    Case("w3_empty_middle_frozen_h0", (9, 0, 12), 1, 3, 16, 16, (0.0, 0.3, 2.0), h0_requires_grad=False,
         output_final_state=False),
    # every slice empty (T = 0): the final state is h0, its gradient the summed final-state gradients
    Case("w2_all_empty", (0, 0), 2, 2, 16, 16, (0.1, 0.5)),
]


def _inputs(case: Case) -> dict:
    """Full-sequence inputs of a case (deterministic), already rounded to the case's dtype."""
    gen = torch.Generator().manual_seed(zlib.crc32(case.name.encode()))
    B, H, K, V, T = case.batch, case.heads, case.dim_k, case.dim_v, sum(case.lengths)
    P = len(case.lengths)

    def randn(*shape, dtype=case.dtype):
        return torch.randn(*shape, generator=gen).to(dtype)

    return {
        "q": randn(B, T, H, K),
        "k": randn(B, T, H, K) / K**0.5,
        "v": randn(B, T, H, V),
        "do": randn(B, T, H, V),
        "slope": None if case.slope is None else torch.tensor(case.slope, dtype=torch.float32),
        "h0": randn(B, H, K, V, dtype=torch.float32) if case.initial_state else None,
        "dht_parts": randn(P, B, H, K, V, dtype=torch.float32),  # rank r's share of the final-state gradient
    }


WORLD_SIZE = max(len(c.lengths) for c in CASES)


def _run_case(case: Case, rank: int, group, workdir) -> dict:
    """This rank's slice of a case through lightning_attn_sp, fwd + bwd: its o, grads and collectives."""
    x = torch.load(workdir / f"{case.name}.pt")
    start = sum(case.lengths[:rank])
    end = start + case.lengths[rank]
    q, k, v = (x[n][:, start:end].clone().requires_grad_() for n in ("q", "k", "v"))
    h0 = None if x["h0"] is None else x["h0"].clone().requires_grad_(case.h0_requires_grad)
    with record_communication() as log:
        o, final = lightning_attn_sp(
            q,
            k,
            v,
            x["slope"],
            group=group,
            scale=case.scale,
            initial_state=h0,
            output_final_state=case.output_final_state,
        )
        loss = (o.float() * x["do"][:, start:end].float()).sum()
        if case.output_final_state:
            loss = loss + (final * x["dht_parts"][rank]).sum()
        loss.backward()
    return {
        "o": o.detach(),
        "final": None if final is None else final.detach(),
        "dq": q.grad,
        "dk": k.grad,
        "dv": v.grad,
        "dh0": None if h0 is None else h0.grad,
        "collectives": [(c.direction, c.send_bytes, c.recv_bytes) for c in log],
    }


def _sp_job(rank: int, world_size: int, workdir) -> dict:
    """Runs every case on this rank; returns {case: this rank's results}.

    A case over fewer ranks than were spawned runs on a subgroup of the first ranks (the others skip it), which
    also covers a non-default ``group``; the full-width cases use ``group=None`` (the default group).
    """
    results = {}
    for case in CASES:
        P = len(case.lengths)
        # new_group is collective: every spawned rank creates it, members use it
        group = None if P == world_size else torch.distributed.new_group(list(range(P)))
        if rank < P:
            results[case.name] = _run_case(case, rank, group, workdir)
    return results


@pytest.fixture(scope="module")
def sp_results(tmp_path_factory):
    """{case name: [per-rank results]}, from one spawn of WORLD_SIZE ranks (process start-up is the cost)."""
    workdir = tmp_path_factory.mktemp("sp")
    for case in CASES:
        torch.save(_inputs(case), workdir / f"{case.name}.pt")
    per_rank = spawn(_sp_job, WORLD_SIZE, workdir)
    return {case.name: [per_rank[r][case.name] for r in range(len(case.lengths))] for case in CASES}


def _reference(case: Case, x: dict) -> dict:
    """Single-process lightning_attn on the full sequence, float64, same loss with dht = Σ_r dht_r."""
    q, k, v = (x[n].to(torch.float64).requires_grad_() for n in ("q", "k", "v"))
    h0 = None if x["h0"] is None else x["h0"].to(torch.float64).requires_grad_(case.h0_requires_grad)
    o, final = la.lightning_attn(
        q, k, v, x["slope"], scale=case.scale, initial_state=h0, output_final_state=case.output_final_state
    )
    loss = (o * x["do"].to(torch.float64)).sum()
    if case.output_final_state:
        loss = loss + (final * x["dht_parts"].to(torch.float64).sum(0)).sum()
    if loss.requires_grad:  # not when every slice is empty and h0 is frozen
        loss.backward()
    dh0 = None if h0 is None else h0.grad
    # a sequence with no token gives its (empty) inputs no gradient in the reference: compare with empty zeros
    grads = {n: t.grad if t.grad is not None else torch.zeros_like(t) for n, t in (("dq", q), ("dk", k), ("dv", v))}
    return {"o": o.detach(), "final": final, **grads, "dh0": dh0}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_single_process(case, sp_results):
    _check_against_single_process(case, sp_results[case.name])


def _check_against_single_process(case: Case, ranks: list[dict]) -> None:
    x = _inputs(case)
    ref = _reference(case, x)
    tol = tolerance(case.dtype)

    for r, res in enumerate(ranks):
        for name in ("o", "dq", "dk", "dv"):
            n_r = case.lengths[r]
            assert res[name].shape[1] == n_r, f"rank {r} {name}: {tuple(res[name].shape)}, slice length {n_r}"
            assert res[name].dtype == case.dtype, f"rank {r} {name}: dtype {res[name].dtype}"
    # the concatenated slices are the full-sequence output and input gradients
    for name in ("o", "dq", "dk", "dv"):
        assert_close(name, torch.cat([res[name] for res in ranks], dim=1), ref[name], tol)

    for r, res in enumerate(ranks):
        if case.output_final_state:  # replicated on every rank
            assert res["final"].dtype == torch.float32
            assert_close(f"final_state (rank {r})", res["final"], ref["final"], tol)
        else:
            assert res["final"] is None
        if case.initial_state and case.h0_requires_grad:  # every rank receives the full gradient of h0
            assert_close(f"dh0 (rank {r})", res["dh0"], ref["dh0"], tol)
        else:
            assert res["dh0"] is None


TRITON_CASE = Case("w2_triton", (37, 22), 1, 2, 16, 32, (0.0, 0.3), scale=0.5)


def _triton_job(rank: int, world_size: int, workdir) -> dict:
    # the public op runs its Triton kernels (interpreter on CPU)
    with settings.override(backend="triton"):
        return _run_case(TRITON_CASE, rank, None, workdir)


@pytest.mark.slow
def test_triton_backend_matches_single_process(tmp_path):
    """The same check with the public op on its Triton kernels (under the interpreter on CPU: slow, so one case)."""
    torch.save(_inputs(TRITON_CASE), tmp_path / f"{TRITON_CASE.name}.pt")
    ranks = spawn(_triton_job, len(TRITON_CASE.lengths), tmp_path)
    _check_against_single_process(TRITON_CASE, ranks)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_one_collective_per_direction_independent_of_length(case, sp_results):
    """The call header, then one all-gather forward and one backward, of exactly the predicted size (no T in it);
    empty slices join every one of them."""
    predicted = sp_communication_bytes(
        case.batch,
        case.heads,
        case.dim_k,
        case.dim_v,
        len(case.lengths),
        output_final_state=case.output_final_state,
        checked=True,  # CPU tensors: the header is exchanged on every call
    )
    expected = [
        ("check", predicted.check_send, predicted.check_recv),
        ("forward", predicted.forward_send, predicted.forward_recv),
        ("backward", predicted.backward_send, predicted.backward_recv),
    ]
    for r, res in enumerate(sp_results[case.name]):
        assert res["collectives"] == expected, f"rank {r}: {res['collectives']} != {expected}"


def test_single_process_falls_back_to_the_op():
    """Without torch.distributed (or with a group of one) lightning_attn_sp is lightning_attn."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 23, 2, 16, generator=gen) for _ in range(3))
    slope = torch.tensor([0.0, 0.2])
    h0 = torch.randn(1, 2, 16, 16, generator=gen)
    with record_communication() as log:
        o, final = lightning_attn_sp(q, k, v, slope, scale=0.5, initial_state=h0, output_final_state=True)
    ref_o, ref_final = la.lightning_attn(
        q.double(), k.double(), v.double(), slope, scale=0.5, initial_state=h0.double(), output_final_state=True
    )
    assert_close("o", o, ref_o, torch.float32)
    assert_close("final_state", final, ref_final, torch.float32)
    assert log == []
    assert sp_communication_bytes(1, 2, 16, 16, world_size=1) == sp_communication_bytes(1, 2, 16, 16, 1)
    assert sp_communication_bytes(1, 2, 16, 16, world_size=1).total_send == 0


def test_rejects_bad_inputs_like_the_op():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="initial_state"):
        lightning_attn_sp(q, q, q, initial_state=torch.zeros(1, 2, 16, 8))
    with pytest.raises(TypeError, match="k must have the dtype of q"):
        lightning_attn_sp(q, q.double(), q)
    with pytest.raises(RuntimeError, match="not initialised"):
        lightning_attn_sp(q, q, q, group=object())


def test_communication_bytes_formula():
    """[B, H, K, V] fp32 states (+ 2 length slots) forward; dS_in (and dfinal) backward; world-size multiples;
    the fixed-size call header when it is checked."""
    vol = sp_communication_bytes(2, 16, 128, 128, 4, output_final_state=True)
    state = 2 * 16 * 128 * 128 * 4
    assert vol.forward_send == state + 8 and vol.forward_recv == 4 * (state + 8)
    assert vol.backward_send == 2 * state and vol.backward_recv == 8 * state
    assert vol.check_send == vol.check_recv == 0 and vol.total_send == 3 * state + 8
    assert sp_communication_bytes(2, 16, 128, 128, 4).backward_send == state
    checked = sp_communication_bytes(2, 16, 128, 128, 4, output_final_state=True, checked=True)
    assert checked.check_send == HEADER_BYTES and checked.check_recv == 4 * HEADER_BYTES
    assert checked.total_send == vol.total_send + HEADER_BYTES


@pytest.mark.parametrize("length, world_size", [(10, 3), (2, 3), (0, 2), (9, 1), (64, 4)])
def test_sequence_bounds_tile_the_sequence(length, world_size):
    bounds = [sequence_bounds(length, r, world_size) for r in range(world_size)]
    assert bounds[0][0] == 0 and bounds[-1][1] == length
    assert all(a[1] == b[0] for a, b in zip(bounds[:-1], bounds[1:]))  # contiguous, in rank order
    sizes = [e - s for s, e in bounds]
    assert max(sizes) - min(sizes) <= 1
    expected = [t.shape[0] for t in torch.arange(length).tensor_split(world_size)]
    assert sizes == expected


def test_shard_sequence_without_distributed_is_identity():
    x = torch.arange(12).reshape(2, 6)
    assert shard_sequence(x) is x
    with pytest.raises(ValueError, match="rank"):
        sequence_bounds(5, 3, 3)


@pytest.mark.gpu
def test_nccl_two_gpus_256k_bf16(tmp_path):
    """benchmarks/sp_check_gpu.py under torchrun on 2 GPUs: T = 256K, bf16 against a float64 chunked reference."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += ["benchmarks/sp_check_gpu.py", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads((tmp_path / "sp_check.json").read_text())
    assert report["passed"], report
