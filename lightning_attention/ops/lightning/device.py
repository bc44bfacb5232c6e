"""What the launch plans need to know of a device, asked once per device: a value, so plans are testable without one.

On CPU tensors the kernels run under Triton's interpreter: :data:`INTERPRETER` stands for that "device" (one program
slot, no shared-memory limit, the tensor-descriptor rules of an sm_90 GPU so that CPU tests run the path an H100
runs).
"""

import functools
from dataclasses import dataclass

import torch

# per-block opt-in shared memory (bytes) by compute capability (major * 10 + minor), for the targets the kernels
# are built for ahead of time; a present GPU's own property wins
SHARED_PER_BLOCK = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448, 100: 232_448, 120: 101_376}
# per-SM shared memory (bytes), for the walk's occupancy; a present GPU's own property wins
SHARED_PER_SM = {80: 167_936, 86: 102_400, 89: 102_400, 90: 233_472, 100: 233_472, 120: 102_400}


@dataclass(frozen=True)
class DeviceInfo:
    """A device as the plans see it.

    ``index``: the CUDA device index (-1: the interpreter); ``capability``: compute capability as major * 10 + minor
    (0 on the interpreter); ``sm_count``: streaming multiprocessors (1 on the interpreter: fewest, largest plans);
    ``shared_per_block`` / ``shared_per_sm``: shared memory in bytes (None on the interpreter: no limit).
    """

    index: int
    capability: int
    sm_count: int
    shared_per_block: int | None
    shared_per_sm: int | None

    @property
    def is_cuda(self) -> bool:
        return self.index >= 0

    @classmethod
    def of_capability(cls, capability: int, sm_count: int, index: int = 0) -> "DeviceInfo":
        """A GPU of this compute capability with its documented shared memory (tests, ahead-of-time planning)."""
        return cls(index, capability, sm_count, SHARED_PER_BLOCK.get(capability), SHARED_PER_SM.get(capability))


INTERPRETER = DeviceInfo(index=-1, capability=0, sm_count=1, shared_per_block=None, shared_per_sm=None)
H100 = DeviceInfo.of_capability(90, sm_count=132)  # the GPU the tuned preferences were measured on


@functools.lru_cache(maxsize=None)
def cuda_device_info(index: int) -> DeviceInfo:
    """The :class:`DeviceInfo` of CUDA device ``index`` (read once per device)."""
    props = torch.cuda.get_device_properties(index)
    cc = props.major * 10 + props.minor
    block = getattr(props, "shared_memory_per_block_optin", 0) or SHARED_PER_BLOCK.get(cc)
    sm = getattr(props, "shared_memory_per_multiprocessor", 0) or SHARED_PER_SM.get(cc, block)
    return DeviceInfo(index, cc, props.multi_processor_count, block, sm)


def device_info(device: torch.device) -> DeviceInfo:
    """The :class:`DeviceInfo` of ``device`` (a CUDA device, or :data:`INTERPRETER` for any other)."""
    if device.type != "cuda":
        return INTERPRETER
    return cuda_device_info(device.index if device.index is not None else torch.cuda.current_device())
