"""The tuned table (``kernels/tuned.py``): a configuration measured for a shape class replaces autotuning where the
selector offers it, and ``benchmarks/tune_table.py``, which measures it, without a GPU (its timings replaced by a
fake that knows the fastest candidate).

Plans are made for an H100 (``device.H100``) as in tests/ops/test_plan.py, so the launches are the ones a GPU run
would make: the autotuner's launcher where the table has no entry, the plain walk with the entry's configuration
where it has one.
"""

import importlib
import pathlib
import runpy

import pytest
import torch

from lightning_attention import settings
from lightning_attention.ops.lightning import launches, plan, run
from lightning_attention.ops.lightning.device import SHARED_PER_BLOCK
from lightning_attention.ops.lightning.kernels import configs, tuned, walk
from lightning_attention.ops.lightning.plan import TMA_MIN_CAPABILITY
from tests.ops.test_plan import problem as plan_problem

ROOT = pathlib.Path(__file__).resolve().parents[2]
TUNED_NAMES = {"lightning_attn walk (tuned)", "lightning_attn dk/dv walk (tuned)"}


def problem(**kwargs):
    """A problem of tests/ops/test_plan.py with the Triton walk: on sm_90 bf16 K = 128 and 256 run the two-warpgroup
    walk (one configuration, nothing to tune) unless the gluon setting is off, which leaves them to the table."""
    return plan_problem(**{"gluon": False, **kwargs})


@pytest.fixture(autouse=True)
def _fresh_programs():
    run.clear_programs()
    yield
    run.clear_programs()


def _walks(program) -> list[tuple[str, tuple | None]]:
    """(launcher name, (BT, BV, num_warps, num_stages) where the launch fixes them) of every walk launch."""
    rows = []
    for launch in program.launches:
        c = launch.constexprs
        if "walk" in launch.launcher.name:
            shape = (c["BT"], c["BV"], c["num_warps"], c["num_stages"]) if "num_warps" in c else None
            rows.append((launch.launcher.name, shape))
    return rows


def _autotuned(p) -> dict:
    run.clear_programs()
    run.forward_program(p)
    return launches.autotuned_launches()


def test_an_entry_replaces_autotuning_for_its_shape_class_only():
    p = problem(B=8, T=8192)
    with tuned.override({}):
        keys = _autotuned(p)
        assert len(keys) == 1 and all(len(options) == configs.MAX_TUNED for options in keys.values())
        (key, options), = keys.items()
        assert key[:3] == ("walk", "bfloat16", "input") and len(key) == 3 + len(walk.AUTOTUNE_KEY)
        assert [name for name, _ in _walks(run.forward_program(p))] == ["lightning_attn walk (tuned)"]

    second = options[1]
    with tuned.override({key: second}):
        run.clear_programs()
        assert _walks(run.forward_program(p)) == [("lightning_attn walk", second)]
        other = problem(B=8, T=8192, K=64, V=64)  # another class: autotuned as before
        assert {name for name, _ in _walks(run.forward_program(other))} <= TUNED_NAMES


def test_the_shipped_sm90_table_fixes_the_benchmark_classes():
    """On sm_90 grid (a) at K = 64 and 128 (T = 1K, 8K and 64K: each WAVES value, whole and in segments; forward
    and backward walks) takes the shipped entries, plain: no autotuning on a class's first call. K = 64's dk and dv
    come from the fused walk, whose descriptor space holds one configuration (plain without an entry); bf16 K = 128
    by default from the two-warpgroup walk, which has one configuration (the entries serve the Triton walk)."""
    for K in (64, 128):
        for B, T in ((64, 1024), (8, 8192), (1, 65536)):
            fwd, bwd = problem(B=B, T=T, K=K, V=K), problem(B=B, T=T, K=K, V=K, backward=True)
            keys = {**_autotuned(fwd), **_backward_keys(bwd)}
            assert keys and all(key in tuned.TABLES[90] for key in keys), (K, B, T)
            entries = {tuned.TABLES[90][key] for key in keys}
            walks = _walks(run.forward_program(fwd)) + _walks(run.backward_program(bwd))
            fused = [("lightning_attn dk/dv walk", (64, 64, 4, 3))] if K == 64 else []
            assert walks and all(
                (name == "lightning_attn walk" and shape in entries) or (name, shape) in fused for name, shape in walks
            ), walks
            assert not fused or fused[0] in walks, walks
    if not plan._walk_ws_available():  # a Triton without the Gluon the two-warpgroup walk was checked with
        return
    for B, T in ((64, 1024), (8, 8192), (1, 65536)):  # bf16 K = 128 by default: the two-warpgroup walk, untuned
        fwd, bwd = problem(B=B, T=T, gluon=True), problem(B=B, T=T, gluon=True, backward=True)
        assert not _autotuned(fwd) and not _backward_keys(bwd), (B, T)


def test_an_entry_the_selector_does_not_offer_is_ignored():
    """A configuration that is not among the candidates there (another GPU's shared memory, a width the GPU checks
    never ran) leaves the launch to the autotuner."""
    p = problem(B=8, T=8192)
    (key, _), = _autotuned(p).items()
    with tuned.override({key: (16, 16, 1, 1)}):
        run.clear_programs()
        assert [name for name, _ in _walks(run.forward_program(p))] == ["lightning_attn walk (tuned)"]


def test_the_setting_off_autotunes_every_launch():
    p = problem(B=8, T=8192)
    (key, options), = _autotuned(p).items()
    with tuned.override({key: options[1]}):
        run.clear_programs()
        off = problem(B=8, T=8192, tuned_table=False)
        assert [name for name, _ in _walks(run.forward_program(off))] == ["lightning_attn walk (tuned)"]
    assert settings.from_environment({"LIGHTNING_ATTENTION_TUNED_TABLE": "0"}).tuned_table is False


def test_keys_tell_shape_classes_apart():
    """Segmented launches, the reverse walks, fp16 and the split precision each have keys of their own; another
    length and batch of the same class, whose programs also take more than one wave, shares them."""
    segmented = _autotuned(problem(B=1, T=131072))
    backward = set(_backward_keys(problem(B=8, T=8192, backward=True)))
    fp16 = _autotuned(problem(B=8, T=8192, dtype=torch.float16))
    split = _autotuned(problem(B=8, T=8192, precision="split"))
    plain = set(_autotuned(problem(B=8, T=8192)))
    assert len(segmented) >= 2  # the pre-pass and the walk over segments
    assert all(not plain & set(keys) for keys in (segmented, fp16, split))
    assert any(key[3 + walk.AUTOTUNE_KEY.index("REVERSE")] for key in backward)
    assert plain == set(_autotuned(problem(B=16, T=4096)))  # more than one wave of programs, as 8 x 8K


def _backward_keys(p) -> dict:
    run.clear_programs()
    run.backward_program(p)
    return launches.autotuned_launches()


@pytest.mark.parametrize("capability", sorted(tuned.TABLES))
def test_shipped_entries_are_candidates_the_gpu_checks(capability):
    """Every entry of a shipped table is a candidate the selector offers for its key on that architecture, so the
    GPU suite's configuration check (tests/ops/test_configs_gpu.py) has run it against float64; its key has the
    kernel's fields."""
    for key, entry in tuned.TABLES[capability].items():
        kind, dtype = key[:2]
        assert kind in ("walk", "dkdv") and dtype in ("bfloat16", "float16", "float32"), key
        if kind == "walk":
            assert entry in _offered(capability, key), (key, entry)


def _offered(capability: int, key: tuple) -> list[tuple[int, int, int, int]]:
    """(BT, BV, num_warps, num_stages) of the candidates the selector offers a walk launch of tuned-table ``key`` on
    GPUs of ``capability``, best first."""
    _, dtype, inter_prec, *values = key
    named = dict(zip(walk.AUTOTUNE_KEY, values, strict=True))
    offered = configs.walk_candidates(
        named["DK"], named["DV"], 4 if dtype == "float32" else 2, SHARED_PER_BLOCK[capability],
        state_only=named["STATE_ONLY"], tma=named["USE_TMA"] and capability >= TMA_MIN_CAPABILITY,
        state_bytes=configs.state_operand_bytes(inter_prec),
    )  # fmt: skip
    return [launches.config_shape(c, {}) for c in offered]


# benchmarks/tune_table.py


@pytest.fixture
def tune_table(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("tune_table")


def test_choose_takes_the_fastest_unless_the_first_is_within_the_tie(tune_table):
    a, b = (64, 64, 4, 2), (64, 64, 4, 3)
    candidates = {"k1": (a, b), "k2": (a, b), "k3": (a, b)}
    times = {
        "k1": {a: [1.00, 1.00], b: [0.90, 0.91]},  # b clearly faster
        "k2": {a: [1.00, 1.00], b: [0.996, 0.996]},  # within 1%: the selector's first
        "k3": {a: [1.00]},  # one measured
    }
    assert tune_table.choose(times, candidates, tie=0.01) == {"k1": b, "k2": a, "k3": a}


def test_render_writes_a_module_that_reads_back(tune_table, tmp_path):
    table = {("walk", "bfloat16", "input", 128, 128, 0, False, True, False, False, False, False, True, 1, False):
             (64, 64, 4, 3)}  # fmt: skip
    module = tmp_path / "tuned_test.py"
    module.write_text(tune_table.render(table, "Measured on a test."))
    assert runpy.run_path(str(module))["CONFIGS"] == table
    assert tune_table.parse_class("bf16:4x16384x64") == ("bf16", 4, 16384, 64, "input")
    assert tune_table.parse_class("fp16:1x2048x128:split") == ("fp16", 1, 2048, 128, "split")
    with pytest.raises(ValueError, match="DTYPE"):
        tune_table.parse_class("fp32:1x2x3")


def test_provenance_names_what_the_entries_depend_on(tune_table):
    """The written module's docstring needs no hand edit: the GPU and its software without the run's time or the
    baselines, the measuring command without the options that name outputs, the results folder of the GPU."""
    info = {"gpu": "NVIDIA H200", "driver": "580.159.04", "cuda": "13.0", "torch": "2.11.0+cu130", "triton": "3.6.0",
            "fla": "0.6.0", "date": "2026-01-01T00:00:00+00:00"}  # fmt: skip
    assert tune_table.gpu_line(info) == (
        "NVIDIA H200 | driver 580.159.04 | CUDA 13.0 | torch 2.11.0+cu130 | triton 3.6.0"
    )
    argv = ["--out", "/tmp/t.py", "--reps", "5", "--json=/tmp/t.json", "--results", "x.json", "--tie", "0.02"]
    assert tune_table.measuring_command(argv) == "python benchmarks/tune_table.py --reps 5 --tie 0.02"
    assert tune_table.results_folder("NVIDIA H200") == "h200"
    assert tune_table.results_folder("NVIDIA H100 80GB HBM3") == "h100"


def test_measure_pins_each_candidate_and_finds_the_fastest(tune_table, monkeypatch):
    """The measuring loop with the GPU replaced: a call plans the class's programs for an H100, and its time says
    which candidate each autotuned launch ran (the second one is faster for every key)."""
    import timed_calls

    class FakeProblem:
        def __init__(self, B, T, D, dtype):  # the settings the script measures under (it turns the Gluon walk off)
            current = settings.current()
            self.p = problem(B=B, T=T, K=D, V=D, dtype=dtype, precision=current.precision, gluon=current.gluon)

        def fwd_bwd(self):
            run.forward_program(self.p)

    def fake_ms(fn, calls):
        fn()
        table = tuned._override or {}
        ran = launches.autotuned_launches()
        return sum(0.9 if table.get(key) == options[1] else 1.0 for key, options in ran.items())

    monkeypatch.setattr(timed_calls, "make_problem", lambda B, T, D, dtype: FakeProblem(B, T, D, dtype))
    monkeypatch.setattr(timed_calls, "kernel_ms", fake_ms)
    classes = [("bf16", 8, 8192, 128, "input"), ("bf16", 1, 131072, 128, "input")]
    times, candidates = tune_table.measure(classes, reps=2, calls=1, log=lambda *_: None)
    assert len(candidates) >= 3
    table = tune_table.choose(times, candidates, tie=0.01)
    assert table == {key: options[1] for key, options in candidates.items()}


# the architectures whose tables ship untimed, each with the SM count its table was planned for and another GPU's:
# an A100 (108) and an A30 (56); a B200 (148) and 132
UNTIMED_SM_COUNTS = {80: (108, 56), 100: (148, 132)}


def test_every_untimed_table_has_its_sm_counts():
    assert set(UNTIMED_SM_COUNTS) == set(tuned.UNTIMED)


@pytest.mark.parametrize("cc", sorted(UNTIMED_SM_COUNTS))
def test_an_untimed_table_is_the_selectors_first_candidates(tune_table, cc):
    """An untimed table is what ``tune_table.py --first-candidates CC`` writes from the current selector (its entries
    are then the builds tests/ops/test_aot.py checks); on another SM count the same keys, whichever WAVES value a
    class takes there. Every entry is a K = 128 walk, through descriptors wherever the architecture has them."""
    planned, other = UNTIMED_SM_COUNTS[cc]
    assert tune_table.first_candidates(cc, planned) == dict(tuned.TABLES[cc])
    assert tune_table.first_candidates(cc, other) == dict(tuned.TABLES[cc])
    for key, entry in tuned.TABLES[cc].items():
        named = dict(zip(walk.AUTOTUNE_KEY, key[3:], strict=True))
        assert named["DK"] == named["DV"] == 128 and named["USE_TMA"] == (cc >= TMA_MIN_CAPABILITY), key
        assert entry == _offered(cc, key)[0], key


@pytest.mark.parametrize("cc", sorted(UNTIMED_SM_COUNTS))
def test_a_gpu_plans_its_untimed_entries_without_autotuning(cc):
    """On an A100 or a B200, every walk of a K = 128 fwd+bwd at 64 × 1K and 8 × 8K (grid (a)) and 1 × 128K (grid (b))
    takes its table's entry: one compile, no timing."""
    from lightning_attention.ops.lightning.device import DeviceInfo

    gpu = DeviceInfo.of_capability(cc, sm_count=UNTIMED_SM_COUNTS[cc][0])
    for B, T in ((64, 1024), (8, 8192), (1, 131072)):
        fwd, bwd = problem(B=B, T=T, device=gpu), problem(B=B, T=T, device=gpu, backward=True)
        walks = _walks(run.forward_program(fwd)) + _walks(run.backward_program(bwd))
        assert walks and all(name == "lightning_attn walk" for name, _ in walks), (B, T, walks)
        assert {shape for _, shape in walks} <= set(tuned.TABLES[cc].values())
