"""Test-only shim: under TRITON_INTERPRET=1 without a GPU, @triton.autotune with more than one config fails
('0 active drivers') because it asks the driver for a benchmarker. Keep only the first config (no benchmarking);
INTERP_AUTOTUNE=all instead runs every config once, timed on the CPU, so that all of them are exercised.
"""

import os
import time

import triton.runtime.autotuner as _at

MODE = os.environ.get("INTERP_AUTOTUNE", "first")


def _cpu_bench(fn, quantiles=None, **kw):
    t0 = time.perf_counter()
    fn()
    dt = (time.perf_counter() - t0) * 1e3
    return [dt] * len(quantiles) if quantiles else dt


if MODE == "first":
    _orig_prune = _at.Autotuner.prune_configs
    _at.Autotuner.prune_configs = lambda self, kwargs: _orig_prune(self, kwargs)[:1]
else:
    _at.Autotuner.do_bench = property(lambda self: self._do_bench or _cpu_bench)
