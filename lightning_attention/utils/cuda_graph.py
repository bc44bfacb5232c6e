"""Capturing a callable in a CUDA graph, the way both the benchmarks and the model's decode step need it."""

import torch


def capture(fn, device: torch.device, warmups: int = 3) -> tuple[torch.cuda.CUDAGraph, object]:
    """``fn`` captured in a new ``torch.cuda.CUDAGraph`` (with a memory pool of its own), after ``warmups`` eager
    calls on a side stream: they compile and autotune every kernel and let cuBLAS set up its workspaces, none of which
    may happen during capture.

    Returns ``(graph, output)``: ``output`` is what ``fn`` returned during capture, which every ``graph.replay()``
    overwrites in place.
    """
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = fn()
    return graph, output
