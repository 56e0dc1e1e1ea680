"""Chat-template rendering: a conversation to the prompt token ids a model generates from."""
from __future__ import annotations


# apply_chat_template's own arguments: a request's chat_template_kwargs may not set them.
RESERVED_TEMPLATE_KWARGS = ("tokenize", "conversation", "messages", "chat_template", "tools", "documents",
                            "return_dict", "return_tensors", "return_assistant_tokens_mask", "padding",
                            "truncation", "max_length", "tokenizer_kwargs")
# The chat request's own fields (vLLM's): chat_template_kwargs may not set them behind the request's back.
REQUEST_TEMPLATE_FIELDS = ("messages", "add_generation_prompt", "continue_final_message", "tools", "documents",
                           "chat_template")


def check_template_kwargs(kwargs: dict | None) -> None:
    """ValueError naming a key of a request's chat_template_kwargs that is no variable of the template."""
    for key in kwargs or {}:
        if key in REQUEST_TEMPLATE_FIELDS:
            raise ValueError(f"{key!r} is the request's own field, not a variable of the template: set the "
                             f"request's {key} instead, and remove it from chat_template_kwargs")
        if key in RESERVED_TEMPLATE_KWARGS:
            raise ValueError(f"{key!r} is an argument of the template renderer, not a variable of the template; "
                             "remove it from chat_template_kwargs")


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                continue_final_message: bool = False, **template_kwargs) -> str:
    """The prompt text of ``messages`` through the tokenizer's chat template, ready for generation
    (the generation prompt added, as vLLM's chat endpoint does by default). continue_final_message:
    the last message is left open for the model to continue (vLLM's; not with add_generation_prompt).
    ``template_kwargs``: variables the template reads (vLLM's chat_template_kwargs, e.g. Qwen3's
    enable_thinking)."""
    if getattr(tokenizer, "chat_template", None):
        if continue_final_message:  # passed only when asked: older tokenizers do not take it
            template_kwargs["continue_final_message"] = True
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             **template_kwargs)
    # A base model without a chat template: a plain transcript is the most neutral fallback.
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    if continue_final_message:
        return text.removesuffix("\n")
    return text + ("assistant: " if add_generation_prompt else "")


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of ``render_chat(tokenizer, messages)``."""
    # The rendered template already holds BOS and role tokens where the model expects them.
    return tokenizer.encode(render_chat(tokenizer, messages), add_special_tokens=False)
