# Which launch the decode step's kernels get (utils/dependent_launch.mojo), run on a CPU
# (tests/kernels/test_gpu_kernel_helpers.py): one attribute (PDL) with pdl, none without. Built with
# --target-accelerator sm_90, as MAX builds a graph's host code for an H100 (without an accelerator PDL is never
# asked for).
from mojo_kernels.utils.dependent_launch import dependent_launch


def main() raises:
    var with_pdl = len(dependent_launch[True]())
    var without = len(dependent_launch[False]())
    if with_pdl != 1 or without != 0:
        raise Error("launch attributes: ", with_pdl, " with pdl (want 1), ", without, " without (want 0)")
    print("ok: 1 launch attribute with pdl, none without")
