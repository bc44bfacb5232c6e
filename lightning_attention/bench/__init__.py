"""Benchmarks: ``lightning-attention bench {kernels,decode,model,hybrid,serving,model-quality}``.

A registry of ops x named shape sets (:mod:`.registry`, :mod:`.providers`) measured by one harness per subcommand
(:mod:`.kernels`, :mod:`.decode`, :mod:`.model`, :mod:`.hybrid`), written as JSON (incrementally, see
:mod:`.results`) and PNG (:mod:`.plots`), each output headed by the machine line (:mod:`.machine`).

A recorded run (a folder of such JSON, e.g. one of ``benchmarks/results/``) is read back by :mod:`.run_folder`,
checked against the performance targets by :mod:`.targets` and printed as the tables of ``docs/performance.md`` by
``python -m lightning_attention.bench.tables DIR`` (:mod:`.tables`).

The timing functions of other parts of the library live beside this harness and are wired in when present:
``decode_timing.py`` (decode kernel), ``model_timing.py`` (TNL vs LLaMA training), ``hybrid_timing.py`` (hybrid
softmax/linear chunk attention), ``serving_timing.py`` (TNL vs LLaMA through HF ``generate()``, :mod:`.serving`).
Nothing here is imported by the library itself.

``model-quality`` (:mod:`.model_quality`) is a training protocol rather than a timing: TNL and its variants against
LLaMA at equal size on a natural-language corpus that :mod:`.corpus` builds from installed documentation.
"""
