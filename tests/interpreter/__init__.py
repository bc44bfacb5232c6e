"""Test-only fixes for Triton's CPU interpreter (TRITON_INTERPRET=1); see shared notes/triton-interpreter.md.

They patch private interpreter internals of the Triton version CI pins (.ci/run), never the library itself.
"""
