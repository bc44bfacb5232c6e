"""A program run without freeing its buffers (``Program.run_keeping_buffers``, for profiling tools that repeat one
launch alone), on CPU under the Triton interpreter: the same outputs as a call, every buffer a call frees kept, and
one launch repeated on the kept buffers writing what it wrote the first time."""

import torch

from lightning_attention.ops.decay import tnl_slopes
from lightning_attention.ops.lightning import run


def test_run_keeping_buffers_matches_a_call(triton_backend):
    triton_backend(segment_len=16)  # segments: the backward frees the dk/dv walks' incoming states at its end
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 40, 2, 16, generator=g) for _ in range(4))
    slope = tnl_slopes(2, 0, 2)
    _, _, fwd_states = run.chunk_forward(q, k, v, slope, None, None, None, 1.0, False)
    problem = run.problem_of(q, k, v, slope, None, None, None, 1.0, False, 0, do, None, fwd_states)
    program = run.backward_program(problem)
    inputs = (q, k, v, do, None, slope, None, None, fwd_states)
    freed = {slot for step in program.steps if step[0] == "free" for slot in step[1]}
    assert freed

    outputs = program(*inputs)
    values = program.run_keeping_buffers(*inputs)

    for slot, expected in zip(program.outputs, outputs, strict=True):
        if slot is not None:
            torch.testing.assert_close(values[slot], expected, rtol=0, atol=0)
    assert all(values[slot] is not None for slot in freed)
    last = program.launches[-1]  # a reverse walk writing dk or dv
    (written,) = {slot for _, slot in last.tensors} & set(program.outputs)
    before = values[written].clone()
    values[written].fill_(float("nan"))
    last.run(values)
    torch.testing.assert_close(values[written], before, rtol=0, atol=0)
