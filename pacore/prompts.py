"""Round prompts: the controller template, the round's conversation and the order of its references.

The conversation is tokenised by the engine's chat-template rendering (engine/chat.py).
"""
from __future__ import annotations

import copy
import random

import jinja2


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


def round_messages(messages: list[dict], references: list[str], *, empty_bypasses: bool = True) -> list[dict]:
    """The conversation for a round: the last user message replaced by the controller prompt.

    With no references the problem is passed unchanged when ``empty_bypasses`` (round 1: the paper's
    degenerate case M = {}). The reference pipeline renders the template for every later round, even
    when every previous response was empty, so its rounds >= 2 pass ``empty_bypasses=False``.
    """
    if not references and empty_bypasses:
        return messages
    i = last_user_index(messages)
    out = copy.deepcopy(messages)
    out[i]["content"] = render_controller_prompt(messages[i]["content"], references)
    return out


# How the reference pipeline orders a round's responses (base_exp.py, ``_run_parallel_calls``): a
# stable sort by ``len(content)`` (code points), then ``random.Random(42).shuffle`` with a Random made
# anew on every call, so the permutation depends only on how many responses there are. That order is
# both what it stores in ``round_responses`` and the order of "Reference i" in the next prompt.
OFFICIAL_SHUFFLE_SEED = 42
SHUFFLES = ("official", "seeded")


def order_responses(items: list, mode: str, seed: int, length=lambda item: len(item.text)) -> list:
    """A round's responses in the order they are recorded and passed on as references.

    ``official``: the reference pipeline's order, byte for byte (its responses come in completion
    order, ours in child index order, which only matters between responses of equal length).
    ``seeded``: a permutation drawn from ``seed`` (derive it per problem and round).
    """
    if mode == "official":
        out = sorted(items, key=length)
        random.Random(OFFICIAL_SHUFFLE_SEED).shuffle(out)
    elif mode == "seeded":
        out = list(items)
        random.Random(seed).shuffle(out)
    else:
        raise ValueError(f"unknown shuffle {mode!r}; expected one of {', '.join(SHUFFLES)}")
    return out

