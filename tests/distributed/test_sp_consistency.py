"""lightning_attn_sp called inconsistently across gloo ranks: a clear error on every rank, never a hang or an abort.

Each probe is one call (forward, and backward when it succeeds) on every rank, where one rank differs from the others
in one way. One spawn of 3 ranks runs every probe in turn (process start-up dominates the cost), with a short
collective timeout: a probe that hangs records the timeout error and fails its own test, and the whole job has a
deadline. Each probe is then checked by its own test: every rank must raise the expected error, and the group must
stay usable afterwards.
"""

import dataclasses
import re
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist

from lightning_attention import settings
from lightning_attention.distributed import call_header, lightning_attn_sp, record_communication
from lightning_attention.distributed.call_header import checksum
from tests.distributed._workers import spawn

WORLD_SIZE = 3
SLOPE = (0.1, 0.5)


def _call(rank: int, *, T=None, B=1, H=2, K=16, V=16, dtype=torch.float32, slope=SLOPE, scale=1.0, h0=True,
          h0_shift=0.0, final=True) -> dict:
    """Keyword arguments of one rank's call: q, k, v ``[B, T, H, K|V]`` (its own slice), h0 ``[B, H, K, V]`` (the
    same on every rank unless ``h0_shift``), ``slope`` ``[H]``; slice lengths 5, 3, 4 by default."""
    T = (5, 3, 4)[rank] if T is None else T
    gen = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(B, T, H, d, generator=gen).to(dtype).requires_grad_() for d in (K, K, V))
    initial_state = None
    if h0:
        initial_state = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(99)) + h0_shift
    return {
        "q": q,
        "k": k,
        "v": v,
        "slope": None if slope is None else torch.tensor(slope, dtype=torch.float32),
        "scale": scale,
        "initial_state": initial_state,
        "output_final_state": final,
    }


@dataclasses.dataclass(frozen=True)
class Probe:
    name: str
    call: Callable[[int], dict]  # rank -> keyword arguments of lightning_attn_sp
    expect: tuple[str, ...] | None  # per rank, a regex the ValueError/TypeError must match; None: the call succeeds
    world: int = WORLD_SIZE  # 2: runs on the subgroup of ranks 0 and 1
    grad_enabled: Callable[[int], bool] = lambda rank: True
    debug: Callable[[int], bool] = lambda rank: False  # the debug setting on this rank


def _same(pattern: str, world: int = WORLD_SIZE) -> tuple[str, ...]:
    return (pattern,) * world


def _other(rank: int, changed_rank: int, changed: dict) -> dict:
    return _call(rank, **(changed if rank == changed_rank else {}))


# module-level functions, not lambdas: the spawned ranks unpickle the probes by name
def _heads(rank):
    return _other(rank, 1, {"H": 3, "slope": (0.1, 0.5, 0.9)})


def _head_dim_k(rank):
    return _other(rank, 2, {"K": 32})


def _head_dim_v(rank):
    return _other(rank, 1, {"V": 8})


def _batch(rank):
    return _other(rank, 0, {"B": 2})


def _dtype(rank):
    return _other(rank, 1, {"dtype": torch.bfloat16})


def _final_state_flag(rank):
    return _other(rank, 2, {"final": False})


def _slope_values(rank):
    return _other(rank, 1, {"slope": (0.1, 0.6)})


def _slope_on_two_ranks(rank):
    return _other(rank, 0, {"slope": None})


def _h0_on_rank0_only(rank):
    return _call(rank, h0=rank == 0)


def _swapped_head_dims(rank):  # K·V equal: the states have the same number of elements
    return _other(rank, 1, {"K": 8, "V": 32})


def _swapped_batch_and_heads(rank):  # B·H equal: the states have the same number of elements
    return _other(rank, 1, {"B": 2, "H": 1, "slope": (0.1,)})


def _scale(rank):
    return _other(rank, 2, {"scale": 0.5, "T": 0})  # the odd rank has an empty slice: it must raise too


def _invalid_h0_on_one_rank(rank):
    kwargs = _call(rank)
    if rank == 1:
        kwargs["initial_state"] = kwargs["initial_state"][..., :8]
    return kwargs


def _h0_values(rank):
    return _other(rank, 2, {"h0_shift": 1e-3})


def _equal_values_other_representation(rank):
    """No false alarm: a float64 slope on one rank with the same values, and -0.0 for 0.0."""
    kwargs = _call(rank, slope=(0.0, 0.5))
    if rank == 1:
        kwargs["slope"] = torch.tensor([-0.0, 0.5], dtype=torch.float64)
    return kwargs


def _consistent(rank):
    return _call(rank, T=(0, 6, 2)[rank])


def _grad_off_on_rank0(rank):
    return rank != 0


def _debug_on_rank1(rank):
    return rank == 1


def _debug_everywhere(rank):
    return True


INCONSISTENT = "inconsistently"
PROBES = [
    Probe("heads", _heads, _same(rf"{INCONSISTENT}.*\n  H \(heads\) differs: rank 0: 2, rank 1: 3, rank 2: 2")),
    Probe("head_dim_k", _head_dim_k, _same(r"K \(head dim of q and k\) differs: rank 0: 16, rank 1: 16, rank 2: 32")),
    Probe("head_dim_v", _head_dim_v, _same(r"V \(head dim of v\) differs: rank 0: 16, rank 1: 8, rank 2: 16")),
    Probe("batch", _batch, _same(r"B \(batch\) differs: rank 0: 2, rank 1: 1, rank 2: 1")),
    Probe("dtype", _dtype, _same(r"dtype differs: rank 0: torch.float32, rank 1: torch.bfloat16, "
                                 r"rank 2: torch.float32")),
    Probe("output_final_state", _final_state_flag, _same(r"output_final_state differs: .* rank 2: False")),
    Probe("slope_values", _slope_values, _same(r"slope \(checksum of its values\) differs")),
    Probe("slope_on_some_ranks", _slope_on_two_ranks, _same(r"slope given differs: rank 0: False, rank 1: True")),
    Probe("h0_on_rank0_only", _h0_on_rank0_only, _same(r"initial_state given differs: rank 0: True, rank 1: False")),
    Probe(
        "same_numel_swapped_head_dims",
        _swapped_head_dims,
        _same(r"K \(head dim of q and k\) differs: rank 0: 16, rank 1: 8\n  V \(head dim of v\) differs", 2),
        world=2,
    ),
    Probe(
        "same_numel_swapped_batch_and_heads",
        _swapped_batch_and_heads,
        _same(r"B \(batch\) differs: rank 0: 1, rank 1: 2\n  H \(heads\) differs: rank 0: 2, rank 1: 1", 2),
        world=2,
    ),
    Probe("scale", _scale, _same(r"scale differs: rank 0: 1.0, rank 1: 1.0, rank 2: 0.5")),
    Probe(
        "invalid_input_on_one_rank",
        _invalid_h0_on_one_rank,
        (
            r"rank\(s\) \[1\] of the group rejected their own inputs",
            r"^initial_state must have shape \[N, H, K, V\] = \(1, 2, 16, 16\), got \(1, 2, 16, 8\)$",
            r"rank\(s\) \[1\] of the group rejected their own inputs",
        ),
    ),
    Probe(
        "grad_mode_off_on_one_rank",
        _call,
        _same(r"runs backward \(grad mode on and an input requires grad\) differs: rank 0: False, rank 1: True"),
        grad_enabled=_grad_off_on_rank0,
    ),
    Probe("debug_mode_on_one_rank", _call, _same(r"debug mode .* differs: rank 0: False, rank 1: True"),
          debug=_debug_on_rank1),
    Probe("h0_values_in_debug_mode", _h0_values, _same(r"initial_state \(checksum of its values, debug mode\) differs"),
          debug=_debug_everywhere),
    Probe("equal_values_other_representation", _equal_values_other_representation, None),
    Probe("consistent_call_after_the_errors", _consistent, None),
]


def _run_probe(probe: Probe, rank: int, group) -> dict:
    """One rank's call of a probe, forward and (on success) backward: the error it raised or its final state."""
    with settings.override(debug=probe.debug(rank)), torch.set_grad_enabled(probe.grad_enabled(rank)):
        try:
            o, final = lightning_attn_sp(**probe.call(rank), group=group)
            if o.requires_grad:
                (o.float().sum() + (0 if final is None else final.sum())).backward()
        except Exception as e:  # noqa: BLE001 - any error is recorded and judged by the probe's test
            return {"error": type(e).__name__, "message": str(e)}
    return {"error": None, "final": None if final is None else final.detach()}


def _first_call_rule(rank: int) -> dict:
    """The rule CUDA tensors follow (forced here on CPU): the header once per call signature. Per call, the
    collectives it issued and how many tensors it read on the host for checksums (a device sync on CUDA); calls 0-1
    share a signature, call 2 changes a flag, call 3 repeats call 0's."""
    call_header.checks_every_call = lambda device, group: False
    reads = []
    plain_checksum = call_header.checksum

    def counted_checksum(x):
        reads.append(tuple(x.shape))
        return plain_checksum(x)

    call_header.checksum = counted_checksum
    calls = []
    for final in (True, True, False, True):
        reads.clear()
        with record_communication() as log:
            lightning_attn_sp(**_call(rank, final=final, h0=False, slope=(0.3, 0.7)))
        calls.append(([c.direction for c in log], len(reads)))
    return calls


def _consistency_job(rank: int, world_size: int, workdir) -> dict:
    pair = dist.new_group([0, 1])  # collective: every rank creates it
    results = {}
    for probe in PROBES:
        if probe.world == world_size:
            results[probe.name] = _run_probe(probe, rank, None)
        elif rank < probe.world:
            results[probe.name] = _run_probe(probe, rank, pair)
    results["first_call_rule"] = _first_call_rule(rank)  # last: it changes the rule for the rest of the process
    return results


@pytest.fixture(scope="module")
def probe_results(tmp_path_factory):
    """{probe name: [per-rank result]} from one spawn; a collective that waits 20 s fails its probe."""
    per_rank = spawn(
        _consistency_job, WORLD_SIZE, tmp_path_factory.mktemp("sp_consistency"), timeout_s=150, collective_timeout_s=20
    )
    results = {p.name: [per_rank[r][p.name] for r in range(p.world)] for p in PROBES}
    results["first_call_rule"] = [res["first_call_rule"] for res in per_rank]
    return results


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.name)
def test_inconsistent_call_raises_on_every_rank(probe, probe_results):
    ranks = probe_results[probe.name]
    if probe.expect is None:
        for r, res in enumerate(ranks):
            assert res["error"] is None, f"rank {r}: {res['error']}: {res.get('message')}"
        finals = [res["final"] for res in ranks]
        assert all(torch.equal(f, finals[0]) for f in finals), "the ranks disagree on the final state"
        return
    for r, (res, pattern) in enumerate(zip(ranks, probe.expect)):
        assert res["error"] in ("ValueError", "TypeError"), f"rank {r}: expected a clear error, got {res}"
        assert re.search(pattern, res["message"], flags=re.MULTILINE), f"rank {r}: {res['message']!r} !~ {pattern!r}"


def test_first_call_rule_checks_each_signature_once(probe_results):
    """CUDA tensors exchange the header on the first call of a signature only: no device sync in steady state."""
    checked, unchecked = (["check", "forward"], 1), (["forward"], 0)  # one checksum read: the slope's
    for r, calls in enumerate(probe_results["first_call_rule"]):
        assert calls == [checked, unchecked, checked, unchecked], f"rank {r}: {calls}"


def test_checksum_sees_every_value_and_only_values():
    """One word changed anywhere changes the checksum; -0.0 is 0.0; the dtype of equal values does not matter."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(257, generator=gen)
    base = checksum(x)
    for i in (0, 1, 128, 256):
        y = x.clone()
        y[i] = torch.nextafter(y[i], torch.tensor(float("inf")))  # one ulp: one low bit of one word
        assert checksum(y) != base, f"a one-ulp change at {i} went unseen"
    assert checksum(x.flip(0)) != base  # positions matter, not only the multiset of values
    assert checksum(x.double()) == base
    assert checksum(torch.tensor([-0.0, 1.0])) == checksum(torch.tensor([0.0, 1.0]))
    assert -(2**63) <= base < 2**63  # one int64 header slot
