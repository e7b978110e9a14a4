"""Request bodies of the HTTP API as pydantic models: the design documents' /generate and OpenAI's
/v1/completions and /v1/chat/completions. Unknown fields are ignored, as OpenAI-compatible servers do."""

from __future__ import annotations

import json

import re
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ..inference.sampling_params import BOUNDS, SamplingParams
from ..tokenizer.tool_calls import TOOL_CALL_START

# JSON can carry "\ud800" alone; json.loads joins valid pairs, so any surrogate left in a str is unpaired
_SURROGATE = re.compile("[\ud800-\udfff]")


def _bounded(name: str, default: Any) -> Any:
    """A float field with SamplingParams' range for `name` (sampling_params.BOUNDS)."""
    bound = BOUNDS[name]
    low = {"gt": bound.low} if bound.low_open else {"ge": bound.low}
    return Field(default, le=bound.high, allow_inf_nan=False, **low)


def _unpaired_surrogate_at(value: Any, where: str) -> Optional[str]:
    """The path (like messages[0].content) of the first string in `value` with an unpaired surrogate."""
    if isinstance(value, str):
        return where if _SURROGATE.search(value) else None
    if isinstance(value, list):
        children = [(f"{where}[{i}]", item) for i, item in enumerate(value)]
    elif isinstance(value, dict):  # each key is checked before the path with it is returned
        children = [
            child for key, item in value.items() for child in ((f"a key of {where}", key), (f"{where}.{key}", item))
        ]
    else:
        return None
    for path, item in children:
        found = _unpaired_surrogate_at(item, path)
        if found:
            return found
    return None


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Body(_Request):
    """A whole request body. Its strings must be valid Unicode: the tokenizer (and the JSON encoder of the
    answer) fail on an unpaired surrogate."""

    @field_validator("*", mode="before")
    @classmethod
    def _check_unicode(cls, value: Any, info: ValidationInfo) -> Any:
        where = _unpaired_surrogate_at(value, info.field_name)
        if where:
            raise ValueError(f"{where} contains an unpaired UTF-16 surrogate (invalid Unicode)")
        return value


GENERATE_DEFAULTS = {"temperature": 1.0, "top_p": 0.95, "top_k": 50}


class GenerateRequest(_Body):
    """POST /generate (defaults of the design documents)."""

    prompt: str = Field(min_length=1)
    max_tokens: int = Field(50, ge=1)
    temperature: Optional[float] = _bounded("temperature", None)
    top_p: Optional[float] = _bounded("top_p", None)
    top_k: Optional[int] = Field(None, ge=-1, lt=2**31)
    stream: bool = False
    ignore_eos: bool = False  # as on the OpenAI routes (vLLM's extension): benchmarks and tests of output lengths

    def sampling_params(self, server_defaults: Dict[str, Any], room: int) -> SamplingParams:
        """Fields left out: the server's defaults (a config file's `sampling`), else the design documents'; a
        max_tokens left out is at most the `room` the context leaves after the prompt."""
        defaults = {**GENERATE_DEFAULTS, **server_defaults}
        pick = lambda name: getattr(self, name) if getattr(self, name) is not None else defaults[name]
        max_tokens = self.max_tokens if "max_tokens" in self.model_fields_set else min(self.max_tokens, room)
        return SamplingParams(temperature=pick("temperature"), top_p=pick("top_p"), top_k=pick("top_k"),
                              max_tokens=max_tokens, ignore_eos=self.ignore_eos)


class StreamOptions(_Request):
    include_usage: bool = False


class _OpenAIRequest(_Body):
    """The sampling fields /v1/completions and /v1/chat/completions share (OpenAI's, plus vLLM's top_k,
    min_p, repetition_penalty, stop_token_ids and ignore_eos). Unset fields take the checkpoint's
    generation_config.json defaults."""

    model: Optional[str] = None
    n: int = Field(1, ge=1, le=16)
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = _bounded("temperature", None)
    top_p: Optional[float] = _bounded("top_p", None)
    top_k: Optional[int] = Field(None, ge=-1, lt=2**31)
    min_p: Optional[float] = _bounded("min_p", None)
    seed: Optional[int] = Field(None, ge=-(2**63), lt=2**63 - 16)  # seed + choice index stays in range
    presence_penalty: Optional[float] = _bounded("presence_penalty", None)
    frequency_penalty: Optional[float] = _bounded("frequency_penalty", None)
    repetition_penalty: Optional[float] = _bounded("repetition_penalty", None)
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[Annotated[int, Field(ge=0, lt=2**31)]]] = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: Optional[StreamOptions] = None

    @model_validator(mode="after")
    def _check_stop(self) -> "_OpenAIRequest":  # each string is checked by SamplingParams
        if isinstance(self.stop, list) and len(self.stop) > 16:
            raise ValueError("at most 16 stop strings")
        return self

    def sampling_params(
        self, defaults: Dict[str, Any], max_tokens: int, logprobs: Optional[int], index: int
    ) -> SamplingParams:
        """Params of choice `index`: with a seed, each of the n choices gets its own (seed + index)."""
        def pick(name: str, fallback: Any) -> Any:
            value = getattr(self, name)
            return value if value is not None else defaults.get(name, fallback)

        return SamplingParams(
            temperature=pick("temperature", 1.0), top_p=pick("top_p", 1.0), top_k=pick("top_k", 0),
            min_p=pick("min_p", 0.0), presence_penalty=pick("presence_penalty", 0.0),
            frequency_penalty=pick("frequency_penalty", 0.0), repetition_penalty=pick("repetition_penalty", 1.0),
            max_tokens=max_tokens, stop=self.stop, stop_token_ids=self.stop_token_ids or [], ignore_eos=self.ignore_eos,
            seed=None if self.seed is None else self.seed + index, logprobs=logprobs,
        )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_OpenAIRequest):
    prompt: Union[str, List[int], List[Union[str, List[int]]]]
    logprobs: Optional[int] = Field(None, ge=0, le=20)
    echo: Literal[False] = False
    suffix: Literal[None] = None

    @model_validator(mode="after")
    def _check_prompt(self) -> "CompletionRequest":
        if not self.prompts:
            raise ValueError("prompt must not be empty")
        if any(isinstance(p, list) and not p for p in self.prompts):
            raise ValueError("prompt token lists must not be empty")
        return self

    @property
    def prompts(self) -> List[Union[str, List[int]]]:
        """One or several prompts: a string, a token list, or a list of strings and token lists."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(t, int) for t in p):
            return [p]
        return list(p)


class TextPart(_Request):
    type: Literal["text"]
    text: str


class FunctionCall(_Request):
    name: str
    arguments: Union[str, Dict[str, Any]]


class ToolCall(_Request):
    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(_Request):
    name: str
    description: Optional[str] = None
    parameters: Optional[Dict[str, Any]] = None


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, List[TextPart]]] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[List[ToolCall]] = None
    tool_call_id: Optional[str] = None
    name: Optional[str] = None

    def template_dict(self) -> Dict[str, Any]:
        """The message as the chat template reads it (text parts joined, developer read as system)."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        message = {"role": "system" if self.role == "developer" else self.role, "content": content or ""}
        for key in ("reasoning_content", "tool_call_id", "name"):
            if getattr(self, key) is not None:
                message[key] = getattr(self, key)
        if self.tool_calls is not None:
            message["tool_calls"] = [call.model_dump(exclude_none=True) for call in self.tool_calls]
        return message


class ChatCompletionRequest(_OpenAIRequest):
    messages: List[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    tools: Optional[List[Tool]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedToolChoice]] = None
    chat_template_kwargs: Optional[Dict[str, Any]] = None

    @model_validator(mode="after")
    def _check_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @model_validator(mode="after")
    def _check_tool_choice(self) -> "ChatCompletionRequest":
        names = [t.function.name for t in self.tools or []]
        if self.tool_choice not in (None, "none", "auto") and not names:
            raise ValueError("tool_choice 'required' or a named function needs tools")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise ValueError(f"tool_choice names function {self.tool_choice.function.name!r}, which is not among "
                             f"the tools {names}")
        return self

    @property
    def offered_tools(self) -> Optional[List[dict]]:
        """The tools the chat template shows the model: none with tool_choice 'none', only the named one."""
        if not self.tools or self.tool_choice == "none":
            return None
        named = self.tool_choice.function.name if isinstance(self.tool_choice, NamedToolChoice) else None
        return [t.model_dump(exclude_none=True) for t in self.tools if named in (None, t.function.name)]

    @property
    def forced_tool_call(self) -> Optional[str]:
        """The start of the answer when a tool call is required: the opening tag, and the named function."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return f'{TOOL_CALL_START}\n{{"name": {json.dumps(self.tool_choice.function.name)}, "arguments": '
        return f"{TOOL_CALL_START}\n" if self.tool_choice == "required" else None

    @property
    def enable_thinking(self) -> bool:
        value = (self.chat_template_kwargs or {}).get("enable_thinking", True)
        if not isinstance(value, bool):
            raise ValueError(f"chat_template_kwargs.enable_thinking must be true or false, got {value!r}")
        return value
