"""Chat-template rendering: a conversation to the prompt token ids a model generates from."""
from __future__ import annotations


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template, ready for generation (the
    generation prompt added, as vLLM's chat endpoint does)."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        # A base model without a chat template: a plain transcript is the most neutral fallback.
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    # The rendered template already holds BOS and role tokens where the model expects them.
    return tokenizer.encode(text, add_special_tokens=False)
