"""Compatibility layers: other libraries' names, argument orders, defaults and return values on this library's ops.

- :mod:`lightning_attention.compat.fla` — flash-linear-attention's ``chunk_lightning_attn`` and
  ``fused_recurrent_lightning_attn``: switching is an import change.

(The official ``lightning_attn`` package's ``lightning_attn_func`` lives at the top level:
:func:`lightning_attention.lightning_attn_func`.)
"""
