"""The logits' drift from float32 of each low-bit weight format, MILI's and llama.cpp's, on one checkpoint (default:
the benchmarks' random-weight Qwen3-0.6B-shaped one). transformers runs in float32 on the checkpoint's weights, then
on each format's weights dequantized:
- MILI int8 / int4 / fp8: the projections as python_layer/model/quantization.py makes them at load, the LM head as
  the model keeps it (6-bit under int4, the format itself otherwise), the embedding as it is;
- llama.cpp's GGUFs written by benchmarks/peers/setup.sh (q8_0, Q4_0, Q4_K_M): every tensor read and dequantized by
  llama.cpp's own gguf-py (the embedding too, as llama.cpp looks it up).
Each format's weights alone, with float32 activations: neither engine's activation rounding (both quantize x to int8
per block for these formats) is in these figures. Per format: the projections' error (the RMS of every projection
weight's error over the RMS of the weights), and over every position of the prompts the RMS of the logits' error
over the RMS of the logits, the largest error over the largest |logit| and how often the argmax agrees with
float32's. --layers keeps the first N decoder layers only: a random-weight model amplifies any error layer after
layer until the logits of 28 layers share little with float32's at 4 bits, whichever the format.
--kv-formats measures the KV caches the same way, with float32 weights: every layer's K (after its norm and RoPE)
and V rounded as the cache holds them before attention reads them: MILI's kv bfloat16 / int8 (a scale per token
and head) / fp8 (e4m3, no scale) exactly as bindings/reference.to_kv_cache stores them, llama.cpp's kv f16 and
q8_0 (blocks of 32 values, a float16 scale each, as its quantize_row_q8_0); llama.cpp also rounds q to q8_0 for its
dot products with a q8_0 K, which is not modelled here.

  mili bench peers accuracy [--model DIR] [--formats int8,int4,q8_0,q4_0,q4_k_m] [--layers N] [--prompts 4]
                            [--kv-formats bfloat16,int8,fp8,f16,q8_0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from benchmarks.common import model_path, print_table, write_json
from bindings import reference as ref
from python_layer.model.quantization import convert, lm_head_dtype

PEERS = Path(__file__).resolve().parent / ".peers"
MILI_FORMATS = ("int8", "int4", "fp8")
GGUF_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def hf_name(gguf_name: str) -> str:
    """A Qwen3 GGUF tensor's Hugging Face name (convert_hf_to_gguf.py's mapping, reversed)."""
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{GGUF_NAMES[parts[2]]}.{parts[3]}"
    return {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}[parts[0]] + ".weight"


def gguf_weights(path: Path) -> dict[str, torch.Tensor]:
    sys.path.insert(0, str(PEERS / "site"))  # gguf-py, installed there by setup.sh
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(path)
    weights = {}
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type)
        weights[hf_name(t.name)] = torch.from_numpy(values.copy()).float().reshape(list(reversed(t.shape.tolist())))
    return weights


def mili_weights(state: dict[str, torch.Tensor], weight_dtype: str) -> dict[str, torch.Tensor]:
    out = {}
    for name, w in state.items():
        if name.endswith("_proj.weight"):
            out[name] = convert(w, weight_dtype, torch.float32).dequantize()
        elif name == "lm_head.weight":
            out[name] = convert(w, lm_head_dtype(weight_dtype), torch.float32).dequantize()
    return out


def _q8_0(x: torch.Tensor) -> torch.Tensor:
    """llama.cpp's q8_0 round trip over the last dimension: blocks of 32, d = max |x| / 127 kept as float16,
    q = round(x / d) (halves away from zero)."""
    blocks = x.float().unflatten(-1, (-1, 32))
    d = blocks.abs().amax(dim=-1, keepdim=True) / 127
    scaled = blocks * torch.where(d > 0, 1 / d, 0)
    q = scaled.sign() * (scaled.abs() + 0.5).floor()
    return (q * d.half().float()).flatten(-2)


KV_FORMATS = {
    "bfloat16": ("mili", lambda x: x.to(torch.bfloat16).float()),
    "int8": ("mili", lambda x: ref.from_kv_cache(ref.to_kv_cache(x, torch.int8), x.shape[-1])),
    "fp8": ("mili", lambda x: ref.from_kv_cache(ref.to_kv_cache(x, torch.float8_e4m3fn), x.shape[-1])),
    "f16": ("llama.cpp", lambda x: x.half().float()),
    "q8_0": ("llama.cpp", _q8_0),
}
"""KV cache format -> (system, what attention reads of K or V rows [..., head_dim])."""


def round_kv(model, rounding) -> None:
    """Makes the model's attention read K and V through `rounding` (None: as they are)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask
    from transformers.models.qwen3.modeling_qwen3 import eager_attention_forward

    def rounded(module, query, key, value, *args, **kwargs):
        return eager_attention_forward(module, query, rounding(key), rounding(value), *args, **kwargs)

    AttentionInterface.register("kv_rounded", rounded)
    AttentionMaskInterface.register("kv_rounded", eager_mask)  # the additive mask eager attention takes
    model.config._attn_implementation = "kv_rounded" if rounding else "eager"


@torch.inference_mode()
def logits(model, prompts: torch.Tensor) -> torch.Tensor:
    return model(prompts).logits.float()


def weight_error(weights: dict[str, torch.Tensor], original: dict[str, torch.Tensor]) -> float:
    names = [n for n in weights if n.endswith("_proj.weight") and n in original]
    err = sum(float((weights[n] - original[n]).pow(2).sum()) for n in names)
    return (err / sum(float(original[n].pow(2).sum()) for n in names)) ** 0.5


def drift(ours: torch.Tensor, exact: torch.Tensor) -> dict:
    err = ours - exact
    return dict(rms_rel=float(err.pow(2).mean().sqrt() / exact.pow(2).mean().sqrt()),
                max_rel=float(err.abs().max() / exact.abs().max()),
                top1_agree=float((ours.argmax(-1) == exact.argmax(-1)).float().mean()))


def main(argv: list[str] | None = None) -> int:
    from transformers import Qwen3ForCausalLM

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--formats", default="int8,int4,q8_0,q4_0,q4_k_m")
    parser.add_argument("--kv-formats", default="", help="KV caches: bfloat16,int8,fp8 (MILI), f16,q8_0 (llama.cpp)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--layers", type=int, default=None, help="the first N decoder layers only (default: all)")
    args = parser.parse_args(argv)
    path = model_path(args.model)
    model = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    if args.layers:
        model.model.layers = model.model.layers[: args.layers]
        model.config.num_hidden_layers = args.layers
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # untied: formats differ
    original = {n: p.detach().clone() for n, p in model.state_dict().items()}
    original["lm_head.weight"] = model.lm_head.weight.detach().clone()
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(1000, 100000, (args.prompts, args.length), generator=g)
    exact = logits(model, prompts)
    rows = []
    for fmt in filter(None, args.kv_formats.split(",")):
        system, rounding = KV_FORMATS[fmt]
        round_kv(model, rounding)
        ours = logits(model, prompts)
        rows.append(dict(system=system, format=f"kv {fmt}", weights_rms_rel=0.0, **drift(ours, exact)))
        print(rows[-1], flush=True)
    round_kv(model, None)
    for fmt in filter(None, args.formats.split(",")):
        if fmt in MILI_FORMATS:
            system, weights = "mili", mili_weights(original, fmt)
        else:
            gguf = PEERS / "gguf" / Path(path).name / f"{fmt}.gguf"
            if not gguf.is_file():
                raise SystemExit(f"{gguf} is missing: write it with bash benchmarks/peers/setup.sh {path}")
            system, weights = "llama.cpp", gguf_weights(gguf)
            if "lm_head.weight" not in weights:  # tied: llama.cpp's output is its token embedding
                weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
        model.load_state_dict({**original, **weights}, strict=False)
        model.lm_head.weight.data.copy_(weights.get("lm_head.weight", original["lm_head.weight"]))
        rows.append(dict(system=system, format=fmt, weights_rms_rel=weight_error(weights, original),
                         **drift(logits(model, prompts), exact)))
        print(rows[-1], flush=True)
    print()
    print_table(rows, list(rows[0]))
    write_json("accuracy", dict(vars(args), model=path), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
