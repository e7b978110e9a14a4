# Programmatic dependent launch (Hopper's PDL) for the kernels of a decode step: a kernel launched with it may start
# while the kernel before it in the stream finishes, so that its launch (and what it reads of memory no earlier
# kernel of the step writes) overlaps that kernel's tail, one boundary of the ~260 of a batch-1 step. Such a kernel
# calls wait_on_dependent_grids() before it reads what an earlier kernel wrote and before it writes anything (its
# outputs may take memory that the kernel before it still reads). A kernel not launched with it returns from the
# wait at once, so the kernels always wait and the `pdl` parameter only chooses the launch: the ops that launch them
# take it as a compile-time parameter, GpuOptions.pdl (bindings/gpu_options.py).
from max.gpu.host.launch_attribute import LaunchAttribute
from max.gpu.primitives.grid_controls import PDLLevel, pdl_launch_attributes


def dependent_launch[pdl: Bool]() raises -> List[LaunchAttribute]:
    """The launch attributes of a kernel that waits as above: PDL's where `pdl`, else none (a plain launch)."""
    comptime if pdl:
        return pdl_launch_attributes(PDLLevel.OVERLAP_AT_BEGINNING)
    return List[LaunchAttribute]()
