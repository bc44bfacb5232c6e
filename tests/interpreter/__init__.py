"""Test-only fixes for Triton's CPU interpreter (TRITON_INTERPRET=1); they patch the interpreter's known gaps,
described in each module.

They patch private interpreter internals of the Triton version CI pins (.ci/run), never the library itself.
"""
