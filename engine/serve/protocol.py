"""The OpenAI API's request and response bodies, as far as the engine implements them.

Requests forbid unknown fields, so a misspelt or unsupported option is a 422 naming it instead of
being silently ignored, and take types strictly, as OpenAI does: ``"max_tokens": true`` or ``"2"``
is a 422, not 1 or 2. A string that is no Unicode text (a lone surrogate, which JSON can escape)
is a 400 in any field. The penalties and logit_bias are the engine's (engine/sample/penalties.py);
``response_format`` is accepted as ``{"type": "text"}`` only, and ``tools`` not at all: structured
output and tool calls are not implemented, and a 422 naming the field says so. Log-probabilities follow OpenAI's shapes (and vLLM's
``prompt_logprobs``); their ranges are checked in ``sampling_params`` (a 400 naming the limit), since
the limit is the engine's ``max_logprobs``.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from engine.chat import check_template_kwargs
from engine.sample.sampling_params import MAX_STOP_CHARS, MAX_STOP_STRINGS, SamplingParams, check_stop

from .logprobs import ChatLogprobs, CompletionLogprobs, PromptLogprobs


INVALID_UNICODE = "invalid_unicode"  # the error type app.py answers with 400
MAX_REQUEST_ID_CHARS = 256


@dataclass(frozen=True, slots=True)
class Limits:
    """What one request may ask for, as this server's flags set it."""
    max_logprobs: int  # --max-logprobs, the engine's
    max_stop_strings: int = MAX_STOP_STRINGS  # --max-stop-strings
    max_stop_chars: int = MAX_STOP_CHARS  # --max-stop-chars


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _unicode(cls, value):
        _check_strings(value)
        return value


def _check_count(field: str, value: int | None, limit: int) -> None:
    if value is not None and not 0 <= value <= limit:
        raise ValueError(f"{field} must be an integer in [0, {limit}] (this server's --max-logprobs is {limit}), "
                         f"got {value}; ask for at most {limit}")


def _check_strings(value) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise PydanticCustomError(INVALID_UNICODE, "not valid Unicode text ({reason} at character {at}); remove "
                                      "lone surrogates", {"reason": e.reason, "at": e.start}) from None
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_strings(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_strings(key)
            _check_strings(item)


class StreamOptions(_Body):
    include_usage: bool = True  # vLLM's default: stream_options sent at all asks for usage
    continuous_usage_stats: bool = False  # vLLM's: usage (so far) in every chunk too


# vLLM's request fields that change nothing here: accepted, and a warning logged that they were ignored
# (vLLM's words: "The following fields were present in the request but ignored").
IGNORED_FIELDS = ("store", "metadata", "service_tier", "reasoning_effort", "parallel_tool_calls")


class _Generate(_Body):
    """The sampling fields shared by both endpoints (OpenAI's, plus vLLM's top_k, min_p,
    repetition_penalty, ignore_eos, stop_token_ids, prompt_logprobs)."""
    model: str
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None  # vLLM's
    logit_bias: dict[str, float] | None = None  # token id (a JSON key, so a string) -> bias in [-100, 100]
    response_format: dict | None = None
    tools: list | None = None
    tool_choice: str | dict | None = None
    user: str | None = None  # an end-user id for abuse tracking; nothing to do with generation
    prompt_logprobs: int | None = None  # vLLM's: each prompt token's logprob (the first's None) and top N
    # vLLM's sampling fields (engine/sample/sampling_params.py)
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    best_of: int | None = None  # vLLM V1's: only 1 (it refuses more)
    # vLLM's request fields: request_id names the reply (cmpl-ID, chatcmpl-ID); priority only 0 (no priority
    # scheduling, as vLLM without --scheduling-policy priority); cache_salt: the prefix cache's salt
    request_id: str | None = None
    priority: int = 0
    # vLLM's, as vLLM means them: beam search off (there is none); the tokenizer's special tokens (BOS)
    # added to the text (default: completions yes, chat no, the template writes its own); only the
    # prompt's last N tokens kept (-1: as many as the context holds)
    use_beam_search: bool = False
    add_special_tokens: bool | None = None
    truncate_prompt_tokens: int | None = None
    cache_salt: str | None = Field(default=None, min_length=1)
    # Accepted and ignored with a warning (IGNORED_FIELDS)
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None

    @field_validator("logit_bias")
    @classmethod
    def _token_biases(cls, value):
        for token, bias in (value or {}).items():
            if not token.isascii() or not token.isdigit():
                raise ValueError(f"keys must be token ids (integers >= 0, as strings), got {token!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"biases must be in [-100, 100] (OpenAI's range), got {bias} for token {token}")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, value):
        if value is not None and value > 1:
            raise ValueError(f"best_of {value} is not supported (as in vLLM's V1 engine, which refuses it too): this "
                             "server returns every sequence it samples; use n, or remove best_of")
        return value

    @field_validator("priority")
    @classmethod
    def _priority(cls, value):
        if value != 0:
            raise ValueError(f"priority {value}: this server schedules first come, first served (no priority "
                             "scheduling, as vLLM without --scheduling-policy priority); send 0 or remove it")
        return value

    @field_validator("request_id")
    @classmethod
    def _request_id(cls, value):
        # It goes into reply ids, and so into logs and headers: printable, and not long
        if value is not None and not (0 < len(value) <= MAX_REQUEST_ID_CHARS and value.isascii()
                                      and all(c.isalnum() or c in "._:-" for c in value)):
            raise ValueError(f"request_id must be 1 to {MAX_REQUEST_ID_CHARS} characters of A-Z, a-z, 0-9 and "
                             "._:- (it names the reply), got " + repr(value[:40]) + "; send such an id or none")
        return value

    @field_validator("use_beam_search")
    @classmethod
    def _no_beam_search(cls, value):
        if value:
            raise ValueError("beam search is a vLLM feature this server does not have; send use_beam_search false "
                             "or remove it")
        return value

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _truncate(cls, value):
        if value is not None and value != -1 and value < 1:
            raise ValueError("truncate_prompt_tokens must be an integer >= 1 (keep the prompt's last N tokens) or "
                             f"-1 (as many as the context holds), got {value}")
        return value

    def ignored_fields(self) -> list[str]:
        """The fields of IGNORED_FIELDS this request set (the server logs them)."""
        return [f for f in IGNORED_FIELDS if f in self.model_fields_set]

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value):
        kind = (value or {}).get("type", "text")
        if value is not None and kind != "text":
            raise ValueError(f"type {kind!r} is not supported by this server (no structured output); remove "
                             "response_format or set its type to 'text'")
        return value

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value):
        if value:
            raise ValueError("tools are not supported by this server (no tool calling); remove tools")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _no_tool_choice(cls, value):
        if value not in (None, "none", "auto"):
            raise ValueError(f"tool_choice {value!r} is not supported by this server (no tool calling); remove it")
        return value

    def budget(self) -> int | None:
        return self.max_tokens

    def logprobs_asked(self) -> int | None:
        """Top alternatives per generated token (0: the chosen token only), None for no logprobs."""
        return None

    def sampling_params(self, default_max_tokens: int | None, limits: Limits,
                        defaults: dict | None = None) -> SamplingParams:
        """The engine's SamplingParams; ValueError (a 400) names a value out of range or beyond
        ``limits`` (the server's flags). ``defaults``: the values a field left out takes (the server's
        --generation-config, vLLM's keys), else OpenAI's."""
        d = defaults or {}
        max_tokens = self.budget()
        if self.top_k is not None and self.top_k >= 2 ** 63:  # the sampler holds it in an int64
            raise ValueError(f"top_k must be -1 or 0 (off) or an integer in [1, 2**63), got {self.top_k}")
        logprobs = self.logprobs_asked()
        prompt_logprobs = self.prompt_logprobs
        _check_count(self.logprobs_field(), logprobs, limits.max_logprobs)
        _check_count("prompt_logprobs", prompt_logprobs, limits.max_logprobs)  # in a stream too: -1 is no 0
        if prompt_logprobs is not None and self.stream:
            if prompt_logprobs > 0:  # as vLLM: a stream has no place for them
                raise ValueError("prompt_logprobs are not available when stream is true; remove prompt_logprobs "
                                 "or set stream to false")
            prompt_logprobs = None  # 0 is accepted, as vLLM does, and asks for nothing a stream sends
        check_stop([self.stop] if isinstance(self.stop, str) else self.stop or [], limits.max_stop_strings,
                   limits.max_stop_chars, "stop", "this server's --max-stop-strings and --max-stop-chars")
        if self.echoes() and logprobs is not None and prompt_logprobs is None:
            prompt_logprobs = logprobs  # echo shows the prompt's logprobs as the generation's (vLLM)
        if self.echoes() and max_tokens == 0:
            # As vLLM: echo with max_tokens 0 (lm-eval's loglikelihood) runs the engine for one token,
            # which computes the prompt's logprobs, and returns the prompt alone (EngineLoop).
            max_tokens = 1
        return SamplingParams(
            n=1 if self.n is None else self.n,
            temperature=d.get("temperature", 1.0) if self.temperature is None else self.temperature,
            top_p=d.get("top_p", 1.0) if self.top_p is None else self.top_p,
            top_k=d.get("top_k", -1) if self.top_k is None else self.top_k,
            min_p=d.get("min_p", 0.0) if self.min_p is None else self.min_p,
            max_tokens=default_max_tokens if max_tokens is None else max_tokens,
            seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids or [],
            ignore_eos=self.ignore_eos, min_tokens=self.min_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output, skip_special_tokens=self.skip_special_tokens,
            logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            presence_penalty=self.presence_penalty or 0.0, frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=d.get("repetition_penalty", 1.0) if self.repetition_penalty is None
            else self.repetition_penalty,
            logit_bias={int(t): b for t, b in self.logit_bias.items()} if self.logit_bias else None)

    def logprobs_field(self) -> str:
        return "logprobs"

    def echoes(self) -> bool:
        """Whether each choice's text starts with its prompt (completions' echo)."""
        return False

    def echo_only(self) -> bool:
        """Echo with max_tokens 0: the reply holds the prompt alone."""
        return self.echoes() and self.max_tokens == 0

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Usage in every chunk (vLLM's continuous_usage_stats; only with include_usage, as vLLM)."""
        return self.include_usage and self.stream_options.continuous_usage_stats


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None

    def for_template(self) -> dict:
        """The message as chat templates read it: text parts joined by newlines, as vLLM does."""
        content = self.content
        if isinstance(content, list):
            content = "\n".join(part.text for part in content)
        message = {"role": self.role, "content": content or ""}
        if self.name is not None:
            message["name"] = self.name
        return message


class ChatCompletionRequest(_Generate):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    # vLLM's chat template fields (engine/chat.py); chat_template_kwargs reach the template as variables
    # (Qwen3's enable_thinking)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict | None = None
    reasoning_effort: str | None = None  # ignored (IGNORED_FIELDS): vLLM reads it for gpt-oss only
    parallel_tool_calls: bool | None = None  # ignored, as vLLM ignores it

    @field_validator("continue_final_message")
    @classmethod
    def _continue_alone(cls, value, info):
        if value and info.data.get("add_generation_prompt", True):
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true: set "
                             "add_generation_prompt to false to continue the last message")
        return value

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables(cls, value):
        check_template_kwargs(value)
        return value

    def template(self) -> dict:
        """How the chat template renders this request's messages (engine/chat.py's render_chat)."""
        return {"add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message, **(self.chat_template_kwargs or {})}

    def budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def logprobs_asked(self) -> int | None:
        if not self.logprobs:
            if self.top_logprobs:  # 0 asks for nothing, so clients that always send it are served
                raise ValueError("top_logprobs needs logprobs: set logprobs to true, or remove top_logprobs")
            return None
        return self.top_logprobs or 0

    def logprobs_field(self) -> str:
        return "top_logprobs"


class CompletionRequest(_Generate):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False

    def logprobs_asked(self) -> int | None:
        return self.logprobs

    def echoes(self) -> bool:
        return self.echo

    def prompts(self) -> list[str | list[int]]:
        """One engine request per prompt: a text, token ids, or a batch of either."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)


# -- responses ---------------------------------------------------------------------------------
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict | None = None  # vLLM's, with --enable-prompt-tokens-details: {"cached_tokens": N}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> Usage:
    """``cached_tokens``: the prompt tokens the prefix cache held (None: not told, prompt_tokens_details null)."""
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens,
                 prompt_tokens_details=None if cached_tokens is None else {"cached_tokens": cached_tokens})


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None
    stop_reason: int | str | None = None  # vLLM's: the stop token id or string that ended it (null: EOS, length)


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None  # vLLM's place for them on this endpoint


class _Response(BaseModel):
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str


class ChatCompletion(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: PromptLogprobs | None = None  # vLLM's place for them on this endpoint (one prompt)


class ChatCompletionChunk(_Response):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class Completion(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def error_body(message: str, type: str, param: str | None = None, code: str | int | None = None) -> dict:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
