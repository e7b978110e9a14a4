"""The Python side of MILI's ops: `reference` is the plain-PyTorch specification of every op."""
