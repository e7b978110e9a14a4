"""Decode steps on fixed-shape inputs, replayed as device graphs on a GPU.

A decode step (one new token for each of B sequences) runs hundreds of kernels; on a GPU at small batches
their launches cost more than their work. MAX records a whole step as a device graph (`Model.capture`, as
MAX's own pipelines do in max/pipelines/lib/graph_capture.py) and runs it again with one launch
(`Model.replay`). A graph replays on the very buffers it was captured with, shapes included, so the step's
inputs are fixed-shape buffers: B padded up to a bucket (1, 2, 4, ..., max_batch) and the page table as wide
as the longest sequence allowed. Each step copies its inputs into its bucket's buffers and replays.

A padding row decodes token 0 at position 0 into a KV page reserved for it (PagedKVCache.reserve_page) and
sees only that: it never reads or writes a sequence's K/V, and its logits are dropped. Replay runs no host
code, so the ops may derive launch shapes only from shapes (fixed per bucket), never from input values.
Where a device cannot capture (a CPU), the same buffers are executed instead: the tests check the padding
and the refresh there against the unpadded step."""

from __future__ import annotations

import itertools
import warnings
import weakref
from collections import deque
from contextlib import nullcontext
from typing import ContextManager, Deque, Dict, List, Optional, Sequence, Tuple

import torch

from max.driver import Buffer, Usage, batch_inplace_copy
from max.dtype import DType

from ..memory.kv_cache_manager import PagedKVCache
from .attention_metadata import SequenceChunk, build_step_inputs
from .qwen3_graph import CompiledQwen3


_instances = itertools.count()  # a model's captured graphs are keyed (instance, bucket): engines may share a model
STAGING_BUFFERS = 3  # a bucket's input buffers in host memory, written in turn (_staged)


def bucket_sizes(max_batch: int) -> List[int]:
    """The batch sizes steps are padded to: powers of two below max_batch, then max_batch."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch}")
    sizes = [1]
    while sizes[-1] * 2 < max_batch:
        sizes.append(sizes[-1] * 2)
    return sizes if sizes[-1] == max_batch else sizes + [max_batch]


class DecodeGraphs:
    """Decode steps of up to max_batch sequences, each on its batch-size bucket's fixed-shape inputs; on a GPU
    captured once per bucket (all of them by warm_up, else at the bucket's first step) and replayed from then on."""

    def __init__(self, compiled: CompiledQwen3, kv_cache: PagedKVCache, max_batch: int, max_pages: int,
                 pad_page: int) -> None:
        """max_pages: the most pages a sequence holds; pad_page: a page of kv_cache reserved for padding rows."""
        if pad_page not in kv_cache.reserved_pages:
            raise ValueError(f"KV page {pad_page} is not reserved: padding rows would write over a sequence's K/V")
        self.compiled, self.kv_cache, self.max_pages, self.pad_page = compiled, kv_cache, max_pages, pad_page
        self.buckets = bucket_sizes(max_batch)
        self.replays = compiled.device_key != "cpu"
        self._device = compiled.model.input_devices[0]
        # bucket -> (its inputs, its captured logits as torch sees them)
        self._steps: Dict[int, Tuple[List[Buffer], Optional[torch.Tensor]]] = {}
        self._staging: Dict[int, Deque[Buffer]] = {}  # bucket -> its page-locked input buffers (_staged)
        self._input_ids: Dict[int, torch.Tensor] = {}  # bucket -> its input ids buffer, seen by torch
        self._stream = _torch_view_of_stream(self._device, kv_cache.k_caches[0].device) if self.replays else None
        # overlapped steps need torch's work ordered with MAX's replays: on MAX's stream, or at once on a CPU
        self.can_overlap = not self.replays or self._stream is not None
        self._key_base = next(_instances) << 32
        self._captured_keys: List[int] = []
        # the captures hold device memory on the (maybe shared) model: released when these graphs go
        weakref.finalize(self, _release, compiled, self._captured_keys)

    def bucket(self, batch: int) -> int:
        for size in self.buckets:
            if size >= batch:
                return size
        raise ValueError(f"a decode step of {batch} sequences exceeds the largest bucket, {self.buckets[-1]}")

    def warm_up(self) -> None:
        """Capture every bucket now, on padding rows alone, so that no request waits for a capture, and check each
        replay against the same step run op by op. RuntimeError when a capture fails or a replay differs."""
        for rows in self.buckets:
            replayed = self._run([], rows)
            if self.replays:
                eager = torch.from_dlpack(self.compiled.execute(self._steps[rows][0], self.kv_cache))
                if not torch.allclose(replayed, eager, rtol=1e-3, atol=1e-3):
                    worst = float((replayed - eager).abs().max())
                    raise RuntimeError(
                        f"the device graph of {rows} sequences gives other logits than the same step run "
                        f"op by op (by up to {worst:.3g})"
                    )

    def __call__(self, chunks: Sequence[SequenceChunk], input_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits [len(chunks), vocab] of one decode step (every chunk one token, at the end of its sequence).
        input_ids: the chunks' tokens as int32 on the device, where the step before sampled them (the chunks' own
        token ids are then placeholders). On a GPU the logits alias the bucket's output buffer: read them (on
        torch_stream) before the next step of the bucket."""
        return self._run(chunks, self.bucket(len(chunks)), input_ids)[: len(chunks)]

    def torch_stream(self) -> ContextManager:
        """Runs torch's work inside it on the stream MAX replays on: one stream then orders the steps, their input
        copies and the sampling between them, so a step can be given to the device before the last one is read."""
        return torch.cuda.stream(self._stream) if self._stream is not None else nullcontext()

    def _run(
        self, chunks: Sequence[SequenceChunk], rows: int, input_ids: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """The logits of all `rows` rows: the chunks', then the padding's."""
        padding = [SequenceChunk([0], 0, [self.pad_page])] * (rows - len(chunks))
        step = build_step_inputs([*chunks, *padding], self.kv_cache.page_size, "cpu", self.max_pages)
        attn = step.attn
        arrays = [step.input_ids, step.positions, attn.query_start, attn.context_lens, attn.page_table,
                  attn.slot_mapping, torch.arange(rows, dtype=torch.int32)]
        if rows not in self._steps:
            self._steps[rows] = ([Buffer.zeros(a.shape, DType.int32, self._device) for a in arrays], None)
            if self.replays:
                self._input_ids[rows] = torch.from_dlpack(self._steps[rows][0][0])
        inputs, logits = self._steps[rows]
        if not self.replays:
            for buffer, a in zip(inputs, arrays):  # in place; MAX's copy would run beside a CPU execution, not before
                buffer.to_numpy()[...] = a.numpy()
            if input_ids is not None:
                inputs[0].to_numpy()[: len(input_ids)] = input_ids.numpy()
            return torch.from_dlpack(self.compiled.execute(inputs, self.kv_cache))
        # through page-locked host memory, copied on the device's stream (so before the replay, and without
        # waiting for the steps before it), as MAX's own graph_capture.py and input stager do
        batch_inplace_copy(inputs, self._staged(rows, arrays))
        if input_ids is not None:  # after that copy on the same stream, before the replay
            with self.torch_stream():
                self._input_ids[rows][: len(input_ids)].copy_(input_ids)
        if logits is None:
            if not self._captured_keys:
                # once, outside any capture: what a kernel sets up on its first run (cuBLAS's handle, with
                # MILI_GPU_VENDOR_BLAS=1) is not to be made inside one
                self.compiled.execute(inputs, self.kv_cache)
            try:
                captured = self.compiled.capture(self._key_base + rows, inputs, self.kv_cache)
            except Exception as e:
                raise RuntimeError(
                    f"capturing the decode step of {rows} sequences as a device graph failed: {e}"
                ) from e
            logits = torch.from_dlpack(captured)  # every replay writes this buffer: seen by torch once
            self._steps[rows] = (inputs, logits)
            self._captured_keys.append(self._key_base + rows)
        # right after the capture too: it may only record
        self.compiled.replay(self._key_base + rows, inputs, self.kv_cache)
        return logits

    def _staged(self, rows: int, arrays: Sequence[torch.Tensor]) -> List[Buffer]:
        """The arrays of a step of bucket `rows` in one page-locked host buffer, as views shaped like them. Each bucket
        has STAGING_BUFFERS of them, made once (not one a step: an allocation of page-locked memory is slow, freeing
        it may wait for the device) and written in turn: by the time one is written again the caller has read the
        tokens of the step that copied from it, and so waited for its copies."""
        ring = self._staging.setdefault(rows, deque())
        if len(ring) < STAGING_BUFFERS:
            ring.appendleft(Buffer(DType.int32, [sum(a.numel() for a in arrays)], device=self._device,
                                   usage=Usage.STAGING | Usage.UNTRACKED))
        staging = ring[0]
        ring.rotate(-1)
        flat, views, at = staging.to_numpy(), [], 0
        for a in arrays:
            flat[at : at + a.numel()] = a.numpy().ravel()
            views.append(staging[at : at + a.numel()].view(DType.int32, list(a.shape)))
            at += a.numel()
        return views


def _torch_view_of_stream(device, torch_device: torch.device) -> Optional[torch.cuda.ExternalStream]:
    """MAX's stream on `device` as a torch stream, tried with one kernel; None (and a warning) where torch
    cannot run on it."""
    try:
        stream = torch.cuda.ExternalStream(device.default_queue.native_stream_handle, device=torch_device)
        with torch.cuda.stream(stream):
            torch.ones(1, device=torch_device).add_(1)
        stream.synchronize()
        return stream
    except Exception as e:  # the engine then reads every step at once, as --no-overlap does
        warnings.warn(f"torch cannot run on MAX's stream ({e}): decode steps are not overlapped", RuntimeWarning,
                      stacklevel=3)
        return None


def _release(compiled: CompiledQwen3, keys: List[int]) -> None:
    for key in keys:
        compiled.release(key)
