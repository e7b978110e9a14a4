"""How far a bfloat16 model's logits move when only its matmuls' summation order changes, against one wrong matmul:
the figures behind the batch-1 graph's load check (qwen3_graph.BATCH_ONE_TOLERANCE).

The batch-1 graph's matmuls (W @ x^T, MAX's vector GEMV on a GPU) and the dynamic graph's (x @ W^T, its split-K
GEMV) both sum in float32 and round once to bfloat16, in different orders, so a rounding lands one ulp apart here and
there and the difference grows over the layers. This runs transformers' Qwen3 on a checkpoint (default: the
Qwen3-0.6B-shaped random one) in bfloat16 with every linear computed in float32 and rounded once, in the order torch
sums (`f32`), as four K-chunks summed (`split_k`), with K reversed (`reversed`), and with one matmul's output rows
permuted (`one_wrong`: the middle layer's o_proj, the kind of mistake the check is for), each against `f32`: the
largest logit difference as a share of the largest logit (what the check bounds), and 1 - the logits' cosine.
CPU; prints a table, writes JSON.
`mili bench engine matmul_order_drift [--model DIR] [--tokens 0,1,7,1000,151643]`
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

import torch
import torch.nn.functional as F

from benchmarks.common import model_path, print_table, write_json

from python_layer.model.qwen3_graph import BATCH_ONE_TOLERANCE

LINEAR = F.linear  # torch's own: last_logits puts another in its place while the model runs


def _rounded_once(order: str) -> Callable:
    """A linear that sums in float32 in `order` and rounds once to the input's dtype."""
    def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        xf, wf = x.float(), w.float()
        if order == "split_k":
            y = sum(LINEAR(a, c) for a, c in zip(xf.chunk(4, -1), wf.chunk(4, -1)))
        elif order == "reversed":
            y = LINEAR(xf.flip(-1), wf.flip(-1))
        else:
            y = LINEAR(xf, wf)
        y = y.to(x.dtype)
        return y if b is None else y + b
    return linear


def _one_wrong(wrong_call: int) -> Callable:
    """A linear as _rounded_once("f32") whose call number `wrong_call` (from 1) gives its output rows permuted."""
    calls = [0]
    plain = _rounded_once("f32")

    def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        calls[0] += 1
        y = plain(x, w, b)
        return y.reshape(*y.shape[:-1], 2, -1).transpose(-1, -2).reshape(y.shape) if calls[0] == wrong_call else y
    return linear


def last_logits(model: torch.nn.Module, token: int, linear: Callable) -> torch.Tensor:
    """The model's logits after one token at position 0 (the check's step), every linear computed by `linear`."""
    F.linear = linear
    try:
        with torch.no_grad():
            return model(torch.tensor([[token]])).logits[0, -1].float()
    finally:
        F.linear = LINEAR


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a Qwen3 checkpoint (default: Qwen3-0.6B's shape, random)")
    parser.add_argument("--tokens", default="0,1,7,1000,151643")
    args = parser.parse_args(argv)
    from transformers import Qwen3ForCausalLM

    path = model_path(args.model)
    model = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    # the o_proj of the middle layer: transformers' Qwen3 calls q, k, v, o, gate, up, down a layer
    wrong_call = 7 * (model.config.num_hidden_layers // 2) + 4
    rows = []
    for token in map(int, args.tokens.split(",")):
        reference = last_logits(model, token, _rounded_once("f32"))
        scale = float(reference.abs().max())
        for form, linear in (("split_k", _rounded_once("split_k")), ("reversed", _rounded_once("reversed")),
                             ("one_wrong", _one_wrong(wrong_call))):
            logits = last_logits(model, token, linear)
            rows.append(dict(token=token, form=form, max_logit=scale,
                             max_diff_share=float((logits - reference).abs().max()) / scale,
                             one_minus_cosine=1 - float(F.cosine_similarity(logits, reference, dim=0))))
    print_table(rows, ["token", "form", "max_logit", "max_diff_share", "one_minus_cosine"])
    print(f"the batch-1 graph's load check fails past {BATCH_ONE_TOLERANCE} of the largest logit")
    write_json("matmul-order-drift", dict(model=path, tolerance=BATCH_ONE_TOLERANCE, wrong_call=wrong_call), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
