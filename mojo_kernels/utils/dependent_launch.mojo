# Programmatic dependent launch (Hopper's PDL) for the kernels of a decode step: a kernel launched with it may start
# while the kernel before it in the stream finishes, so that its launch (and what it reads of memory no earlier
# kernel of the step writes) overlaps that kernel's tail, one boundary of the ~260 of a batch-1 step. Such a kernel
# calls wait_on_dependent_grids() before it reads what an earlier kernel wrote and before it writes anything (its
# outputs may take memory that the kernel before it still reads). A kernel not launched with it returns from the
# wait at once, so the kernels always wait and the setting only chooses the launch.
from max.gpu.host.launch_attribute import LaunchAttribute
from max.gpu.primitives.grid_controls import PDLLevel, pdl_launch_attributes
from std.os import getenv

comptime PDL_SETTING = "MILI_GPU_PDL"
"""1: the decode step's kernels (the norms, decode attention, its split merge) launch with PDL; 0 or unset: as the
other kernels do (for measuring both)."""


def dependent_launch() raises -> List[LaunchAttribute]:
    """The launch attributes of a kernel that waits as above: PDL's where PDL_SETTING is 1."""
    var setting = getenv(PDL_SETTING)
    if setting == "1":
        return pdl_launch_attributes(PDLLevel.OVERLAP_AT_BEGINNING)
    if setting != "" and setting != "0":
        raise Error(PDL_SETTING, " is '", setting, "': set 1 (PDL launches) or 0 (plain ones), or unset it")
    return List[LaunchAttribute]()
