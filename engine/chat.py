"""Chat-template rendering: a conversation to the prompt token ids a model generates from."""
from __future__ import annotations


def render_chat(tokenizer, messages: list[dict]) -> str:
    """The prompt text of ``messages`` through the tokenizer's chat template, ready for generation
    (the generation prompt added, as vLLM's chat endpoint does)."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # A base model without a chat template: a plain transcript is the most neutral fallback.
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of ``render_chat(tokenizer, messages)``."""
    # The rendered template already holds BOS and role tokens where the model expects them.
    return tokenizer.encode(render_chat(tokenizer, messages), add_special_tokens=False)
