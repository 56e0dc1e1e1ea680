"""A request's prompts to token ids, on a worker thread: the chat template, a character bound, the
tokenizer, the context check. Tokenizing a 10 MB prompt takes seconds, and on the engine thread it
froze every stream; here the engine keeps stepping, and the character bound refuses such a prompt
before the tokenizer sees it."""
from __future__ import annotations

from engine.chat import render_chat
from engine.core.checks import check_text
from engine.sample.sampling_params import SamplingParams

# A token covers at most its vocabulary entry's characters (byte-level entries spell one character per
# byte, so never fewer than the text they cover). The margin is for normalizers that compose
# characters first (NFC joins at most 4 code points into one).
NORMALIZER_MARGIN = 4


class PromptReader:
    """Turns the prompts of a request into token ids for the engine; thread-safe (it only reads)."""

    def __init__(self, tokenizer, max_model_len: int):
        self.tokenizer, self.max_model_len = tokenizer, max_model_len
        longest = max(map(len, tokenizer.get_vocab()), default=1) if tokenizer is not None else 1
        self.max_chars = max_model_len * longest * NORMALIZER_MARGIN

    def token_ids(self, prompt, chat: bool, params: SamplingParams, template: dict | None = None,
                  add_special_tokens: bool | None = None, truncate: int | None = None) -> list[int]:
        """``prompt``: chat messages, a text or token ids; ``template``: render_chat's keyword arguments
        (the chat request's template fields); ``add_special_tokens``: the tokenizer's (None: for a text
        only, not a rendered chat); ``truncate``: keep the last N tokens (-1: max_model_len), as vLLM's
        truncate_prompt_tokens. ValueError (a 400) names what is wrong."""
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            ids = prompt
        else:
            special = not chat if add_special_tokens is None else add_special_tokens
            ids = self._tokenize(prompt, chat, special, template or {})
        if truncate is not None:
            ids = ids[-(self.max_model_len if truncate == -1 else truncate):]
        self._check_context(len(ids), params)
        return ids

    def text(self, prompt, ids: list[int]) -> str:
        """A completions prompt as its echo shows it: the text sent, or its token ids decoded (as vLLM)."""
        if isinstance(prompt, str):
            return prompt
        return self.tokenizer.decode(ids) if self.tokenizer is not None else ""

    def _tokenize(self, prompt, chat: bool, special: bool, template: dict) -> list[int]:
        tok = self.tokenizer
        if tok is None:
            raise ValueError("this server has no tokenizer: send token ids to /v1/completions")
        try:
            # Chat: as vLLM, and as `pacore run` builds its prompts (engine/chat.py).
            text = render_chat(tok, prompt, **template) if chat else prompt
        except Exception as e:  # e.g. a template that rejects these messages (roles, order)
            raise ValueError(f"the prompt could not be rendered by the chat template: {e}") from None
        check_text(text)  # a lone surrogate breaks tokenizers (the request models refuse it first)
        if len(text) > self.max_chars:  # cannot fit, whatever the tokenizer makes of it
            raise ValueError(f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                             f"messages have {len(text)} characters, more than that many tokens can hold "
                             f"({self.max_chars} characters at most). Please reduce the length of the messages.")
        try:
            return tok.encode(text, add_special_tokens=special)
        except Exception as e:
            raise ValueError(f"the prompt could not be tokenized: {e}") from None

    def _check_context(self, num_prompt: int, params: SamplingParams) -> None:
        # The engine refuses this too; vLLM's wording is kept because clients act on it (the
        # reference PaCoRe client retries without max_tokens on "reduce the length").
        limit, budget = self.max_model_len, params.max_tokens or 1  # None: the rest of the context
        if num_prompt + budget > limit:
            raise ValueError(f"This model's maximum context length is {limit} tokens. However, you requested "
                             f"{num_prompt + budget} tokens ({num_prompt} in the messages, {budget} in the "
                             "completion). Please reduce the length of the messages or completion.")
