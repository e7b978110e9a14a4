# MILI's kernels as MAX custom ops: every op has a CPU path and a GPU path, chosen by its `target`.
