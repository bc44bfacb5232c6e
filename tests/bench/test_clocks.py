"""lightning_attention.bench.clocks: nvidia-smi's samples read, a measurement's window summarised, the poller run
against a stand-in for nvidia-smi (no GPU), and on a GPU the real one."""

import os
import stat
import time

import pytest
import torch

from lightning_attention.bench import clocks
from lightning_attention.bench.kernels import clock_fields
from lightning_attention.bench.timing import Timing, bench


def test_parse_sample_reads_the_three_fields_and_refuses_the_rest():
    assert clocks.parse_sample("1665, 612.40, Active\n") == (1665.0, 612.4, True)
    assert clocks.parse_sample("1980, 127.1, Not Active") == (1980.0, 127.1, False)
    for line in ("[N/A], 127.1, Not Active", "", "1980, 127.1", "1980, 127.1, Active, x"):
        assert clocks.parse_sample(line) is None


def test_a_window_gives_mean_and_lowest_clock_power_and_share_capped():
    window = clocks.summarise_window([(0.0, 1980.0, 300.0, False), (0.05, 1660.0, 700.0, True)])
    assert window == {"samples": 2, "sm_mhz_mean": 1820.0, "sm_mhz_min": 1660.0, "watts_mean": 500.0,
                      "capped_share": 0.5}  # fmt: skip
    assert clocks.summarise_window([]) == {"samples": 0}


def test_nothing_to_sample_on_a_cpu_device():
    assert clocks.start(torch.device("cpu")) is None and clocks.limits(torch.device("cpu")) is None
    # a CPU timing has no clock, so a record gets no clock fields
    assert clock_fields("fwd", bench(lambda: None, torch.device("cpu"), warmup_ms=1, rep_ms=5)) == {}


def test_clock_fields_of_a_sampled_timing():
    timing = Timing(1.0, 0.9, 1.1, {"samples": 3, "sm_mhz_mean": 1700.0, "sm_mhz_min": 1650.0, "watts_mean": 650.0,
                                    "capped_share": 0.667})  # fmt: skip
    assert clock_fields("fwdbwd", timing) == {"fwdbwd_sm_mhz": 1700.0, "fwdbwd_capped_share": 0.667}
    assert clock_fields("fwd", Timing(1.0, 0.9, 1.1, {"samples": 0})) == {}
    assert timing.to_json()["clock"]["sm_mhz_mean"] == 1700.0 and "clock" not in Timing(1.0, 1.0, 1.0).to_json()


def test_sampler_keeps_what_the_poller_prints_and_windows_it(tmp_path):
    """A stand-in for nvidia-smi that prints two samples (and a line to skip), then waits to be stopped: the
    poller's arguments, its reader thread and :meth:`window` over the time the samples arrived."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/argv"\necho "1980, 130.5, Not Active"\n'
                    'echo "[N/A], 1, Active"\necho "1650, 700.0, Active"\nexec sleep 30\n')  # fmt: skip
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    t0 = time.monotonic()
    sampler = clocks.Sampler(str(fake), "GPU-x")
    try:
        deadline = time.monotonic() + 10
        while len(sampler.samples) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        window = sampler.window(t0, time.monotonic())
        assert window["samples"] == 2 and window["sm_mhz_mean"] == 1815.0 and window["capped_share"] == 0.5
        assert sampler.window(t0 - 10, t0 - 5) == {"samples": 0}
    finally:
        sampler.close()
    assert sampler.proc.poll() is not None  # stopped, not left behind
    argv = (tmp_path / "argv").read_text().split()
    assert argv[:2] == ["-i", "GPU-x"] and f"--query-gpu={clocks.FIELDS}" in argv and "-lms=50" in argv


@pytest.mark.gpu
def test_the_gpu_clock_is_sampled_over_a_timed_call():
    """On the GPU: the poller finds the device, a timed matmul loop gets samples with a clock between the lowest
    plausible and the top one nvidia-smi reports, and the power limit is read."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    device = torch.device("cuda")
    sampler = clocks.start(device)
    if sampler is None:
        pytest.skip("no nvidia-smi on this machine")
    try:
        x = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
        timing = bench(lambda: x @ x, device, warmup_ms=100, rep_ms=400, sampler=sampler)
    finally:
        sampler.close()
    limits = clocks.limits(device)
    top = float(limits["clocks.max.sm"].split()[0])
    assert timing.clock["samples"] >= 3
    assert 100 < timing.clock["sm_mhz_min"] <= timing.clock["sm_mhz_mean"] <= top
    assert 0 <= timing.clock["capped_share"] <= 1 and limits["power.limit"].endswith("W")
    assert os.path.basename(sampler.proc.args[0]) == "nvidia-smi"
