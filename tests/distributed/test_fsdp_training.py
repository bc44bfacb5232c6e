"""``train(data_parallel="fsdp")`` on gloo ranks: FSDP2 over a ("dp", "sp") DeviceMesh trains like one process, and
its checkpoints resume exactly at the same world size and within float rounding at another one (4 ranks -> 2,
FSDP-only -> sequence parallel, one process -> FSDP2 on 2 ranks), under DDP or with other FSDP2 units.

Every run is a few steps of the smoke preset with the same global batch of 4 sequences: one process with batch 4,
FSDP2 on 2 ranks with batch 2 each, FSDP2 over dp 2 x sp 2 on 4 ranks with batch 2 per replica. Two spawned jobs
(4 ranks, then 2) run all the distributed trainings, so the processes start twice.
"""

import json
import os
from unittest import mock

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from lightning_attention.models.presets import model_from_config
from lightning_attention.train import TrainConfig, parallel, train
from lightning_attention.train.checkpoint import load_pretrained, load_training_state, verify_checkpoint
from lightning_attention.train.data import load_text, split_text, validation_batches
from lightning_attention.train.distributed import DistInfo
from lightning_attention.train.tokenizer import encode_corpus, resolve_tokenizer
from lightning_attention.train.trainer import build_model
from tests.distributed._workers import spawn

STEPS, SAVE_EVERY = 4, 2
# 9 validation windows: 2 data-parallel ranks hold 5 and 4 of them, 3 and 2 batches of 2, and must still run the
# same number of forward passes (FSDP2 all-gathers parameters in each)
VALIDATION = {"val_fraction": 0.01, "eval_batches": 8}
ROUNDING = {"rtol": 2e-5, "atol": 0}  # the same arithmetic, gradient sums in another order


def _cfg(out, **options) -> TrainConfig:
    """The runs' shared options: 4 steps, a checkpoint (and a validation) every 2, a global batch of 4."""
    return TrainConfig.smoke(steps=STEPS, save_every=SAVE_EVERY, eval_every=SAVE_EVERY, progress=False,
                             out=str(out), **VALIDATION, **options)


def _record(result) -> dict:
    return {"train": result.train_losses, "val": result.val_losses, "step": result.step}


def _four_ranks(rank, world_size, workdir) -> dict:
    """FSDP2 over dp 2 x sp 2 with activation checkpointing; then resumed from its step-2 checkpoint on 4 ranks."""
    runs = workdir.parent / "runs"
    straight = train(_cfg(runs / "mesh", data_parallel="fsdp", sequence_parallel=2, batch_size=2,
                          gradient_checkpointing=True))
    resumed = train(_cfg(runs / "mesh-resumed", data_parallel="fsdp", sequence_parallel=2, batch_size=2,
                         gradient_checkpointing=True, resume=str(runs / "mesh" / "previous")))
    return {"straight": _record(straight), "resumed": _record(resumed)}


def _recording_builds(builds: list):
    """Within the block, every model the trainer builds appends the device its parameters are on to ``builds``."""
    from lightning_attention.train import trainer

    def build(*args, **kwargs):
        model = model_from_config(*args, **kwargs)
        builds.append(next(model.parameters()).device.type)
        return model

    return mock.patch.object(trainer, "model_from_config", build)


def _recording_units(units: list):
    """Within the block, every ``fully_shard`` call appends what it shards: the class name of one module, or the
    number of modules it groups into one unit."""
    import torch.distributed.fsdp as fsdp

    shard = fsdp.fully_shard

    def recorded(module, **kwargs):
        units.append(len(module) if isinstance(module, list) else type(module).__name__)
        return shard(module, **kwargs)

    return mock.patch.object(fsdp, "fully_shard", recorded)


def _failed_build(rank, world_size) -> str:
    """``build_model`` for FSDP2 when rank 0's build raises: the error each rank ends with (none may wait for rank 0's
    weights forever)."""
    info = DistInfo(rank, world_size, rank, initialized=True)
    layout = parallel.build_layout(info, 1, torch.device("cpu"), sp_capable=True)

    def build():
        raise ValueError("no weights here")

    try:
        build_model(build, layout, info, torch.device("cpu"), "fsdp")
    except Exception as exc:  # noqa: BLE001 - what each rank raised is the result
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _two_ranks(rank, world_size, workdir) -> dict:
    """FSDP2-only on 2 ranks (recording where each rank built the model); then the resumes at another world size or
    layout. A resumed run names the saved options (``batch_size`` included, per rank as saved): the trainer splits
    the global batch anew."""
    runs = workdir.parent / "runs"
    builds, units, grouped_units = [], [], []
    with _recording_builds(builds), _recording_units(units):  # one FSDP2 unit per decoder block
        fsdp = train(_cfg(runs / "fsdp", data_parallel="fsdp", batch_size=2, fsdp_unit_blocks=1))
    with _recording_units(grouped_units):  # the default units: the smoke preset's two decoder blocks as one
        grouped = train(_cfg(runs / "fsdp-grouped", data_parallel="fsdp", batch_size=2))
    # saved on 4 ranks (dp 2 x sp 2), resumed on 2 without sequence parallelism
    from_mesh = train(_cfg(runs / "from-mesh", data_parallel="fsdp", sequence_parallel=1, batch_size=2,
                           resume=str(runs / "mesh" / "previous")))
    # saved FSDP-only on 2 ranks, resumed with sequence parallelism over both (one replica: batch 4)
    to_sp = train(_cfg(runs / "to-sp", data_parallel="fsdp", sequence_parallel=2, batch_size=2,
                       resume=str(runs / "fsdp" / "previous")))
    # saved by one process (batch 4), resumed under FSDP2 on 2 ranks (batch 2 each)
    from_single = train(_cfg(runs / "from-single", data_parallel="fsdp", batch_size=4,
                             resume=str(runs / "single" / "previous")))
    # saved by FSDP2, resumed by DDP on the same ranks: sharded optimizer state into full replicas
    to_ddp = train(_cfg(runs / "to-ddp", data_parallel="ddp", batch_size=2, resume=str(runs / "fsdp" / "previous")))
    # saved with one decoder block per FSDP2 unit, resumed with the default units (both blocks in one)
    regrouped = train(_cfg(runs / "regrouped", data_parallel="fsdp", batch_size=2,
                           resume=str(runs / "fsdp" / "previous")))
    return {"builds": builds, "failed_build": _failed_build(rank, world_size), "units": units,
            "grouped_units": grouped_units, **{name: _record(r) for name, r in (
                ("fsdp", fsdp), ("grouped", grouped), ("from_mesh", from_mesh), ("to_sp", to_sp),
                ("from_single", from_single), ("to_ddp", to_ddp), ("regrouped", regrouped))}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("fsdp")
    single = train(_cfg(base / "runs" / "single", batch_size=4))
    four = spawn(_four_ranks, 4, base / "job4")
    two = spawn(_two_ranks, 2, base / "job2")
    return {"single": _record(single), "four": four, "two": two, "dir": base / "runs"}


def _close(got: dict, ref: dict, steps=slice(None)) -> None:
    torch.testing.assert_close(torch.tensor(got["train"][steps]), torch.tensor(ref["train"][steps]), **ROUNDING)
    got_val = dict(got["val"])
    ref_val = {s: v for s, v in ref["val"] if s in got_val}
    assert ref_val and set(ref_val) == set(got_val)
    torch.testing.assert_close(torch.tensor([got_val[s] for s in sorted(ref_val)]),
                               torch.tensor([ref_val[s] for s in sorted(ref_val)]), **ROUNDING)


def test_the_ranks_hold_unequal_numbers_of_validation_batches():
    cfg = _cfg("unused", batch_size=2)
    _, val_text = split_text(load_text(cfg.data, max_chars=cfg.max_chars), cfg.val_fraction)
    tokens = encode_corpus(resolve_tokenizer("bytes"), val_text)
    counts = [len(validation_batches(tokens, cfg.context, 2, cfg.eval_batches, rank, 2)) for rank in range(2)]
    assert counts == [3, 2]


def test_every_rank_reports_the_same_run(runs):
    per_rank = ("builds", "failed_build")
    for job in (runs["four"], [{k: v for k, v in r.items() if k not in per_rank} for r in runs["two"]]):
        assert all(r == job[0] for r in job[1:])


def test_under_fsdp_only_rank_0_builds_the_whole_model_and_on_its_cpu(runs):
    """Every rank builds the model on the meta device for FSDP2 to shard; rank 0 alone also builds it whole, on its
    CPU, and fills every rank's shards from it (the runs above train like one process from those weights)."""
    assert [r["builds"] for r in runs["two"]] == [["cpu", "meta"], ["meta"]]


def test_a_failed_build_on_rank_0_fails_every_rank(runs):
    assert [r["failed_build"] for r in runs["two"]] == [
        "ValueError: no weights here", "RuntimeError: rank 0 could not build the model: ValueError: no weights here"
    ]


def test_fsdp_over_a_2x2_mesh_trains_like_one_process(runs):
    mesh = runs["four"][0]["straight"]
    assert mesh["step"] == STEPS and len(mesh["train"]) == STEPS
    _close(mesh, runs["single"])


def test_fsdp_only_on_2_ranks_trains_like_one_process(runs):
    _close(runs["two"][0]["fsdp"], runs["single"])


def test_fsdp_units_of_several_blocks_train_like_one_process(runs):
    """``fsdp_unit_blocks``: with 1, one unit per decoder block, then the root; by default (three blocks per unit)
    the smoke preset's two blocks are one unit. The training is the same."""
    two = runs["two"][0]
    assert two["units"] == ["TransNormerDecoderLayer", "TransNormerDecoderLayer", "TransNormerForCausalLM"]
    assert two["grouped_units"] == [2, "TransNormerForCausalLM"]
    _close(two["grouped"], runs["single"])


def test_resume_at_the_same_world_size_is_bit_exact(runs):
    straight, resumed = runs["four"][0]["straight"], runs["four"][0]["resumed"]
    assert resumed["train"] == straight["train"] and resumed["val"] == straight["val"]


@pytest.mark.parametrize("name, reference", [("from_mesh", ("four", "straight")), ("to_sp", ("two", "fsdp")),
                                             ("from_single", ("single",)), ("to_ddp", ("two", "fsdp")),
                                             ("regrouped", ("two", "fsdp"))])
def test_resume_at_another_world_size_continues_the_run(runs, name, reference):
    """The steps before the checkpoint come from it unchanged; the ones after equal the uninterrupted run's."""
    ref = runs[reference[0]] if len(reference) == 1 else runs[reference[0]][0][reference[1]]
    got = runs["two"][0][name]
    assert got["step"] == STEPS
    assert got["train"][:SAVE_EVERY] == ref["train"][:SAVE_EVERY]
    _close(got, ref, slice(SAVE_EVERY, None))


def test_the_global_batch_is_kept_and_recorded(runs):
    for name, per_rank, ranks in (("from-mesh", 2, 2), ("to-sp", 4, 1), ("from-single", 2, 2)):
        state = load_training_state(str(runs["dir"] / name))
        assert state["options"]["batch_size"] == per_rank and state["data_parallel_ranks"] == ranks, name


def test_fsdp_shards_the_optimizer_state_over_every_rank(runs):
    """4 ranks (dp 2 x sp 2): each writes its quarter of every AdamW tensor (row slices, offsets in the header)."""
    folder = runs["dir"] / "mesh-resumed" / "optimizer"
    files = sorted(os.listdir(folder))
    assert len(files) == 4
    key = "state.model.embed_tokens.weight.exp_avg"
    offsets, rows = [], 0
    for name in files:
        with safe_open(str(folder / name), framework="pt") as f:
            names = f.keys()
            if key in names:
                offsets.append(json.loads(f.metadata()["DCP_SHARDING_INFO"])[key]["saved_offsets"][0])
                rows += f.get_slice(key).get_shape()[0]
    assert sorted(offsets) == [0, 64, 128, 192] and rows == 256  # [vocab 256, d 32] in four row blocks


def test_an_fsdp_checkpoint_is_a_whole_transformers_folder(runs):
    """model.safetensors holds the full weights gathered from the shards: what one process trained, within rounding,
    and loadable by transformers."""
    out = str(runs["dir"] / "fsdp")
    verify_checkpoint(out)
    fsdp = load_file(os.path.join(out, "model.safetensors"))
    single = load_file(str(runs["dir"] / "single" / "model.safetensors"))
    assert fsdp.keys() == single.keys()
    for name in fsdp:
        torch.testing.assert_close(fsdp[name], single[name], rtol=1e-4, atol=1e-6, msg=name)
    model, _ = load_pretrained(out)
    assert type(model).__name__ == "TransNormerForCausalLM"
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["architectures"] == ["TransNormerForCausalLM"]
