# Which launch the decode step's kernels get (utils/dependent_launch.mojo), run on a CPU
# (tests/kernels/test_gpu_kernel_helpers.py) with MILI_GPU_PDL as the test sets it: one attribute (PDL) for 1, none
# for 0 or unset, an error that names the setting for anything else. Built with --target-accelerator sm_90, as MAX
# builds a graph's host code for an H100 (without an accelerator PDL is never asked for).
from std.os import getenv

from mojo_kernels.utils.dependent_launch import PDL_SETTING, dependent_launch


def main() raises:
    var setting = getenv(PDL_SETTING)
    var valid = setting == "" or setting == "0" or setting == "1"
    var attributes: Int
    try:
        attributes = len(dependent_launch())
    except e:
        if valid or PDL_SETTING not in String(e):
            raise e^
        print("ok:", PDL_SETTING, "='", setting, "' refused", sep="")
        return
    if not valid:
        raise Error("no error for ", PDL_SETTING, "='", setting, "'")
    if attributes != (1 if setting == "1" else 0):
        raise Error(PDL_SETTING, "='", setting, "': ", attributes, " launch attributes")
    print("ok:", PDL_SETTING, "='", setting, "': ", attributes, " launch attributes", sep="")
