"""Benchmarks: ``lightning-attention bench {kernels,decode,model,hybrid,model-quality}``.

A registry of ops x named shape sets (:mod:`.registry`, :mod:`.providers`) measured by one harness per subcommand
(:mod:`.kernels`, :mod:`.decode`, :mod:`.model`, :mod:`.hybrid`), written as JSON (incrementally, see
:mod:`.results`) and PNG (:mod:`.plots`), each output headed by the machine line (:mod:`.machine`).

The timing functions of other parts of the library live beside this harness and are wired in when present:
``decode_timing.py`` (decode kernel), ``model_timing.py`` (TNL vs LLaMA training), ``hybrid_timing.py`` (hybrid
softmax/linear chunk attention). Nothing here is imported by the library itself.

``model-quality`` (:mod:`.model_quality`) is a training protocol rather than a timing: TNL and its variants against
LLaMA at equal size on a natural-language corpus that :mod:`.corpus` builds from installed documentation.
"""
