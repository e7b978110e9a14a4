"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions (JSON or SSE streams)."""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, List, Optional

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from ..inference.request import RequestOutput, new_request_id
from ..inference.sampler import TokenLogprobs
from ..tokenizer.chat_template import ReasoningStream
from ..tokenizer.qwen_tokenizer import CheckpointTokenizer
from ..tokenizer.tool_calls import ToolCallStream, split_tool_calls
from .errors import ApiError
from .protocol import ChatCompletionRequest, CompletionRequest, _OpenAIRequest
from .sse import SSE_DONE, sse_error, sse_event
from .state import ServerState

router = APIRouter()


def _state(request: Request) -> ServerState:
    return request.app.state.mili


@router.get("/v1/models")
async def list_models(request: Request) -> dict:
    state = _state(request)
    engine = state.require_engine().engine
    return {"object": "list", "data": [{"id": state.config.model_name, "object": "model", "created": int(time.time()),
                                        "owned_by": "mili", "max_model_len": engine.max_model_len}]}


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    state = _state(request)
    state.check_model(body.model)
    prompts = [await state.token_ids(p) for p in body.prompts]
    call = _Call(state, request, body, prompts, "cmpl", body.logprobs)
    if body.stream:
        return StreamingResponse(call.completion_chunks(), media_type="text/event-stream")
    finals = await call.finals()
    choices = [{"index": i, "text": out.text, "finish_reason": out.finish_reason,
                "logprobs": call.completion_logprobs(out.logprobs, 0) if body.logprobs is not None else None}
               for i, out in enumerate(finals)]
    return call.envelope("text_completion", choices, usage=call.usage(finals))


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    state = _state(request)
    state.check_model(body.model)
    state.require_engine()
    forced = body.forced_tool_call  # a required call is begun for the model, without thinking first
    tools = body.offered_tools
    try:
        prompt = await asyncio.to_thread(state.formatter.encode_chat, [m.template_dict() for m in body.messages],
                                         enable_thinking=body.enable_thinking and forced is None,
                                         tools=tools, answer_start=forced or "")
    except (jinja2.TemplateError, TypeError) as e:  # the template rejects the conversation (order of roles, ...)
        raise ApiError(400, f"messages cannot be rendered with the chat template: {e}", param="messages") from None
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    call = _Call(state, request, body, [await state.token_ids(prompt)], "chatcmpl", logprobs,
                 max_tokens=body.max_completion_tokens or body.max_tokens)
    if body.stream:
        return StreamingResponse(call.chat_chunks(bool(tools), forced), media_type="text/event-stream")
    finals = await call.finals()
    choices = []
    for i, out in enumerate(finals):
        reasoning, content = ReasoningStream().feed(out.text, final=True)  # as the streamed split, in one piece
        message = {"role": "assistant", "content": content, "reasoning_content": reasoning or None}
        calls = []
        if tools:
            message["content"], calls = split_tool_calls((forced or "") + content)
            if calls:
                message["tool_calls"] = [c.to_openai() for c in calls]
        choices.append({"index": i, "message": message, "finish_reason": _finish_reason(out.finish_reason, bool(calls)),
                        "logprobs": call.chat_logprobs(out.logprobs) if body.logprobs else None})
    return call.envelope("chat.completion", choices, usage=call.usage(finals))


def _finish_reason(reason: Optional[str], made_calls: bool) -> Optional[str]:
    return "tool_calls" if made_calls and reason == "stop" else reason


class _Call:
    """One API call: its n choices per prompt submitted together, their outputs as JSON or SSE chunks."""

    def __init__(self, state: ServerState, request: Request, body: _OpenAIRequest, prompts: List[List[int]],
                 kind: str, logprobs: Optional[int], max_tokens: Optional[int] = None) -> None:
        engine = state.require_engine().engine
        self.tokenizer: CheckpointTokenizer = engine.tokenizer
        self.body, self.prompts = body, prompts
        self.id, self.created = new_request_id(kind), int(time.time())
        self.model = state.config.model_name
        defaults = {**engine.model.config.generation_defaults, **state.config.sampling_defaults}
        ids, params = [], []
        for prompt in prompts:
            limit = max_tokens or body.max_tokens or engine.max_model_len - len(prompt)
            for j in range(body.n):
                ids.append(prompt)
                params.append(body.sampling_params(defaults, limit, logprobs, j))
        self.stream = state.submit(ids, params, self.id)
        self.deltas = state.outputs(request, self.stream)

    async def finals(self) -> List[RequestOutput]:
        async for _ in self.deltas:
            pass
        if not self.stream.finished:
            raise ApiError(499, "the client disconnected")
        return [r.output() for r in self.stream.requests]

    def usage(self, finals: List[RequestOutput]) -> dict:
        prompt = sum(len(p) for p in self.prompts)
        completion = sum(len(o.token_ids) for o in finals)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def envelope(self, obj: str, choices: List[dict], **extra) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices, **extra}

    def _token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def completion_logprobs(self, logprobs: List[TokenLogprobs], offset: int) -> dict:
        tokens = [self._token(lp.token_id) for lp in logprobs]
        offsets = []
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in logprobs],
                "top_logprobs": [{self._token(t): v for t, v in lp.top} for lp in logprobs], "text_offset": offsets}

    def chat_logprobs(self, logprobs: List[TokenLogprobs]) -> dict:
        def entry(token_id: int, logprob: float) -> dict:
            token = self._token(token_id)
            return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

        return {"content": [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                            for lp in logprobs]}

    async def _streamed(self, chunks: AsyncIterator[dict], chunk_object: str) -> AsyncIterator[str]:
        """SSE: the chunks, the usage chunk when asked for, then [DONE]; an engine failure as an error event."""
        try:
            async for chunk in chunks:
                yield sse_event(chunk)
            if self.body.include_usage:
                finals = [r.output() for r in self.stream.requests]
                yield sse_event(self.envelope(chunk_object, [], usage=self.usage(finals)))
        except Exception as e:
            yield sse_error(f"the request failed: {e}")
        yield SSE_DONE

    def completion_chunks(self) -> AsyncIterator[str]:
        async def chunks() -> AsyncIterator[dict]:
            offsets = [0] * len(self.stream.requests)  # text sent so far per choice, for logprobs' text_offset
            async for delta in self.deltas:
                i = self.stream.index[delta.request_id]
                if not delta.text and not delta.logprobs and not delta.finished:
                    continue
                logprobs = None
                if self.body.logprobs is not None:
                    logprobs = self.completion_logprobs(delta.logprobs or [], offsets[i])
                offsets[i] += len(delta.text)
                yield self.envelope(
                    "text_completion",
                    [{"index": i, "text": delta.text, "finish_reason": delta.finish_reason, "logprobs": logprobs}],
                )

        return self._streamed(chunks(), "text_completion")

    def chat_chunks(self, parse_tools: bool, forced: Optional[str]) -> AsyncIterator[str]:
        """Deltas of reasoning, content and (parse_tools) tool calls: each call's id and name, then its
        arguments; `forced`: the start of the answer that the prompt already holds."""
        async def chunks() -> AsyncIterator[dict]:
            n = len(self.stream.requests)
            started, reasoning = [False] * n, [ReasoningStream() for _ in range(n)]
            tool_streams = [ToolCallStream() for _ in range(n)]
            if forced:
                for tool_stream in tool_streams:
                    tool_stream.feed(forced)
            async for delta in self.deltas:
                i = self.stream.index[delta.request_id]
                if not started[i]:
                    started[i] = True
                    yield self._chat_chunk(i, {"role": "assistant", "content": ""}, None, None)
                new_reasoning, new_content = reasoning[i].feed(delta.text, final=delta.finished)
                new_calls = []
                if parse_tools:
                    new_content, new_calls = tool_streams[i].feed(new_content, final=delta.finished)
                lp = self.chat_logprobs(delta.logprobs or []) if self.body.logprobs else None
                for key, value in (("reasoning_content", new_reasoning), ("content", new_content)):
                    if value:
                        yield self._chat_chunk(i, {key: value}, lp, None)
                        lp = None
                for k, tool_call in enumerate(new_calls, start=tool_streams[i].calls - len(new_calls)):
                    head = {"index": k, "id": tool_call.id, "type": "function",
                            "function": {"name": tool_call.name, "arguments": ""}}
                    yield self._chat_chunk(i, {"tool_calls": [head]}, lp, None)
                    lp = None
                    yield self._chat_chunk(
                        i, {"tool_calls": [{"index": k, "function": {"arguments": tool_call.arguments}}]}, None, None
                    )
                if delta.finished:
                    yield self._chat_chunk(i, {}, lp, _finish_reason(delta.finish_reason, tool_streams[i].calls > 0))

        return self._streamed(chunks(), "chat.completion.chunk")

    def _chat_chunk(self, index: int, delta: dict, logprobs: Optional[dict], finish_reason: Optional[str]) -> dict:
        return self.envelope("chat.completion.chunk", [{"index": index, "delta": delta, "logprobs": logprobs,
                                                        "finish_reason": finish_reason}])
