"""Chat-template rendering: a conversation to the prompt token ids a model generates from."""
from __future__ import annotations


# apply_chat_template's own arguments: a request's chat_template_kwargs may not set them.
RESERVED_TEMPLATE_KWARGS = ("tokenize", "conversation", "messages", "chat_template", "tools", "documents",
                            "return_dict", "return_tensors", "return_assistant_tokens_mask", "padding",
                            "truncation", "max_length", "tokenizer_kwargs")


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
