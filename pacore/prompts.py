"""Round prompts: the controller template and chat-template tokenisation."""
from __future__ import annotations

import copy
import random

import jinja2

from .seeds import derive_seed

# The controller prompt PaCoRe-8B was trained with, verbatim from the official repository
# (stepfun-ai/PaCoRe, pacore/batch_inference/base_exp.py, format_controller_prompt). The source
# string ends with a newline, which jinja2's default ``keep_trailing_newline=False`` removes.
CONTROLLER_TEMPLATE = """\
You are given a problem and a list of reference responses. Your job is to analyze these references and provide your own response.

Original Problem:
{{ original_prompt }}

Reference Responses:
{% for response in ref_responses %}
Reference {{ loop.index }}:
{{ response }}
{% endfor %}

Now, based on the original problem and reference responses above, please provide your own comprehensive solution.
"""

# A default Environment, as the official ``jinja2.Template(...)``: no trim_blocks, no lstrip_blocks,
# no autoescaping (references are plain text, not HTML).
_TEMPLATE = jinja2.Environment().from_string(CONTROLLER_TEMPLATE)


def render_controller_prompt(original_prompt: str, ref_responses: list[str]) -> str:
    """Render the controller prompt; references are numbered from 1 in the given order."""
    return _TEMPLATE.render(original_prompt=original_prompt, ref_responses=ref_responses)


def last_user_index(messages: list[dict]) -> int:
    """Index of the last user message; ValueError if there is none."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    raise ValueError("the conversation has no user message")


def round_messages(messages: list[dict], references: list[str]) -> list[dict]:
    """The conversation for a round: the last user message replaced by the controller prompt.

    With no references (round 1, or every previous message empty) the problem is passed unchanged,
    the degenerate case the paper describes (the template is bypassed when the message set is empty).
    """
    if not references:
        return messages
    i = last_user_index(messages)
    out = copy.deepcopy(messages)
    out[i]["content"] = render_controller_prompt(messages[i]["content"], references)
    return out


def shuffle_references(references: list[str], run_seed: int, problem_key: str, round_idx: int) -> list[str]:
    """A reproducible permutation of the references (avoids position bias toward early samples)."""
    out = list(references)
    random.Random(derive_seed(run_seed, problem_key, round_idx, "shuffle")).shuffle(out)
    return out


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template, ready for generation."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        # A base model without a chat template: a plain transcript is the most neutral fallback.
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    # The rendered template already holds BOS and role tokens where the model expects them.
    return tokenizer.encode(text, add_special_tokens=False)
