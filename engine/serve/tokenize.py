"""vLLM's /tokenize and /detokenize: the served model's tokenizer over HTTP, in vLLM's request and
response shapes, for clients that probe them to find the tokenizer (lm-eval, agent frameworks) or
count tokens before they send a prompt.

POST /tokenize takes a text (``prompt``, special tokens added unless ``add_special_tokens`` is
false) or chat ``messages`` (through the chat template, the generation prompt added unless
``add_generation_prompt`` is false; ``continue_final_message`` leaves the last message open) and
answers ``{"count", "max_model_len", "tokens", "token_strs"}`` (``token_strs`` only with
``return_token_strs``). With the defaults, the ids are those the completion routes generate from.
POST /detokenize takes ``{"tokens": [...]}`` and answers ``{"prompt": text}``.
"""
from __future__ import annotations

from typing import Annotated, Union

from pydantic import Discriminator, Field, Tag, field_validator

from engine.chat import check_template_kwargs, render_chat
from engine.core.checks import check_text

from .protocol import ChatMessage, _Body


class TokenizeCompletionRequest(_Body):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(_Body):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False  # the template writes its own
    return_token_strs: bool | None = False
    chat_template_kwargs: dict | None = None  # variables of the template, as the chat route takes them

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables(cls, value):
        check_template_kwargs(value)
        return value


# /tokenize's body: a chat when it has messages, else a text. Chosen by that, not by trying both, so a
# 422 names the fields of the one the client meant (the tag is the error location's second part).
TOKENIZE_TAGS = ("text", "chat")
TokenizeRequest = Annotated[Union[Annotated[TokenizeCompletionRequest, Tag("text")],
                                  Annotated[TokenizeChatRequest, Tag("chat")]],
                            Discriminator(lambda body: "chat" if isinstance(body, dict) and "messages" in body else "text")]


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


def tokenize(tokenizer, body: TokenizeCompletionRequest | TokenizeChatRequest, max_model_len: int) -> dict:
    """The reply to /tokenize (ValueError: a 400 naming the problem). Runs on a worker thread."""
    if tokenizer is None:
        raise ValueError("this server has no tokenizer (it was started without one)")
    if isinstance(body, TokenizeChatRequest):
        if body.continue_final_message and body.add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true: set "
                             "add_generation_prompt to false to continue the last message")
        text = _render(tokenizer, [m.for_template() for m in body.messages], body.add_generation_prompt,
                       body.continue_final_message, body.chat_template_kwargs or {})
    else:
        text = body.prompt
    check_text(text)
    try:
        ids = tokenizer.encode(text, add_special_tokens=body.add_special_tokens)
    except Exception as e:
        raise ValueError(f"the prompt could not be tokenized: {e}") from None
    strs = tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": strs}


def detokenize(tokenizer, body: DetokenizeRequest) -> dict:
    """The reply to /detokenize (ValueError: a 400 naming the problem)."""
    if tokenizer is None:
        raise ValueError("this server has no tokenizer (it was started without one)")
    vocab = len(tokenizer)
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise ValueError(f"token id {bad} is not in the tokenizer's vocabulary of {vocab} ids")
    return {"prompt": tokenizer.decode(body.tokens)}


def _render(tokenizer, messages: list[dict], add_generation_prompt: bool, continue_final: bool,
            variables: dict) -> str:
    """The chat template's text, as the chat route renders it (engine/chat.py)."""
    try:
        return render_chat(tokenizer, messages, add_generation_prompt, continue_final, **variables)
    except Exception as e:  # a template that rejects these messages (roles, order)
        raise ValueError(f"the messages could not be rendered by the chat template: {e}") from None
