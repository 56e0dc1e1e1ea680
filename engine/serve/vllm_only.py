"""vLLM's request fields this server does not have, each with the feature it belongs to: a request
that sends one gets a 422 naming it as a vLLM feature missing here (app.py), rather than the bare
"not a field" of a typo, so a client ported from vLLM learns what to drop."""

VLLM_ONLY_FIELDS = {
    **dict.fromkeys(("guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
                     "guided_whitespace_pattern", "structured_outputs"), "structured output (guided decoding)"),
    "length_penalty": "beam search (its length penalty)",
    "allowed_token_ids": "restricting sampling to allowed_token_ids",
    "bad_words": "bad words",
    "logits_processors": "custom logits processors",
    "return_tokens_as_token_ids": "token ids in place of token texts",
    "return_token_ids": "token ids in the reply",
    "prompt_embeds": "prompt embeddings",
    "mm_processor_kwargs": "multimodal input",
    "kv_transfer_params": "disaggregated prefill (KV transfer)",
    "vllm_xargs": "extra arguments for vLLM plugins",
    "spaces_between_special_tokens": "spaces between special tokens (a detokenizer option)",
    "echo": "echo on the chat endpoint",
    "chat_template": "a chat template per request (start the server with --chat-template)",
    "documents": "documents for RAG chat templates",
}


def missing_feature(field: str) -> str | None:
    """The 422's sentence for vLLM's ``field`` (None: not one of vLLM's)."""
    what = VLLM_ONLY_FIELDS.get(field)
    return None if what is None else f"{what} is a vLLM feature this server does not have; remove {field}"
