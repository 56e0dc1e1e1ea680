import random

import pytest

from engine.chat import chat_prompt_ids
from pacore.prompts import (
    CONTROLLER_TEMPLATE,
    last_user_index,
    render_controller_prompt,
    order_responses,
    round_messages,
)
from pacore.compaction import Trajectory
from pacore.seeds import derive_seed

EXPECTED_ROUND2 = (
    "You are given a problem and a list of reference responses. Your job is to analyze these "
    "references and provide your own response.\n"
    "\n"
    "Original Problem:\n"
    "What is 1+1?\n"
    "\n"
    "Reference Responses:\n"
    "\n"
    "Reference 1:\n"
    "The answer is \\boxed{2}.\n"
    "\n"
    "Reference 2:\n"
    "I think 3.\n"
    "Final: 3\n"
    "\n"
    "\n"
    "Now, based on the original problem and reference responses above, please provide your own "
    "comprehensive solution."
)


def test_round2_prompt_byte_for_byte():
    got = render_controller_prompt("What is 1+1?", ["The answer is \\boxed{2}.", "I think 3.\nFinal: 3"])
    assert got == EXPECTED_ROUND2
    assert got.encode() == EXPECTED_ROUND2.encode()


def test_template_text_is_the_official_one():
    # default jinja2 Environment: no trim_blocks, trailing newline of the source dropped
    assert CONTROLLER_TEMPLATE.endswith("comprehensive solution.\n")
    assert not render_controller_prompt("p", ["r"]).endswith("\n")


def test_references_not_html_escaped():
    got = render_controller_prompt("a < b & c", ["<think>x</think> 1 < 2"])
    assert "a < b & c" in got and "<think>x</think> 1 < 2" in got


def test_round_messages_replaces_only_last_user_message():
    msgs = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "What is 1+1?"},
    ]
    out = round_messages(msgs, ["The answer is \\boxed{2}.", "I think 3.\nFinal: 3"])
    assert out[:3] == msgs[:3]
    assert out[3] == {"role": "user", "content": EXPECTED_ROUND2}
    assert msgs[3]["content"] == "What is 1+1?"  # input untouched


def test_round_messages_without_references_bypasses_template():
    msgs = [{"role": "user", "content": "q"}]
    assert round_messages(msgs, []) == msgs


def test_last_user_index():
    assert last_user_index([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]) == 0
    try:
        last_user_index([{"role": "system", "content": "a"}])
    except ValueError:
        pass
    else:
        raise AssertionError


def test_rendered_prompt_with_unstripped_references_byte_for_byte():
    # the case: the first reference is the text after </think>, its leading blank lines kept
    got = render_controller_prompt("What is 1+1?", ["\n\nThe answer is \\boxed{2}.", "It is 2"])
    assert got == (
        "You are given a problem and a list of reference responses. Your job is to analyze these references "
        "and provide your own response.\n\nOriginal Problem:\nWhat is 1+1?\n\nReference Responses:\n\n"
        "Reference 1:\n\n\nThe answer is \\boxed{2}.\n\nReference 2:\nIt is 2\n\n\nNow, based on the original "
        "problem and reference responses above, please provide your own comprehensive solution."
    )


def _trajs(texts):
    return [Trajectory(i, t) for i, t in enumerate(texts)]


def test_official_order_is_length_sort_then_the_fixed_random_42_shuffle():
    texts = ["dddd", "a", "ccc", "bb"]  # lengths 4, 1, 3, 2 by child index
    out = order_responses(_trajs(texts), "official", seed=123)
    # sorted by length: a, bb, ccc, dddd; random.Random(42).shuffle of 4 items is [2, 1, 3, 0]
    assert [t.text for t in out] == ["ccc", "bb", "dddd", "a"]
    assert [t.index for t in out] == [2, 3, 0, 1]
    # a new Random(42) on every call: the same permutation whatever the seed, call or problem
    assert order_responses(_trajs(texts), "official", seed=7) == out
    # the same as the reference's own two statements on dicts
    ref = [{"content": t} for t in texts]
    ref.sort(key=lambda x: len(x["content"]))
    random.Random(42).shuffle(ref)
    assert [r["content"] for r in ref] == [t.text for t in out]


def test_official_order_keeps_index_order_between_equal_lengths():
    out = order_responses(_trajs(["x1", "x2", "x3", "x4"]), "official", seed=0)
    assert [t.index for t in out] == [2, 1, 3, 0]  # the shuffle alone: the sort was stable


def test_seeded_order_is_reproducible_and_per_seed():
    trajs = _trajs([str(i) for i in range(16)])
    a = order_responses(trajs, "seeded", seed=derive_seed(0, "p1", 1, "shuffle"))
    assert a == order_responses(trajs, "seeded", seed=derive_seed(0, "p1", 1, "shuffle"))
    assert sorted(t.index for t in a) == list(range(16)) and a != trajs
    assert a != order_responses(trajs, "seeded", seed=derive_seed(0, "p2", 1, "shuffle"))
    assert [t.index for t in trajs] == list(range(16))  # input untouched
    with pytest.raises(ValueError, match="unknown shuffle"):
        order_responses(trajs, "random", seed=0)


def test_derive_seed_stable_across_processes():
    # sha256-based: a fixed value, not Python's salted hash()
    assert derive_seed(0, "p", 1, "sample") == derive_seed(0, "p", 1, "sample")
    assert derive_seed(0, "p", 1, "sample") != derive_seed(0, "p", 1, "shuffle")
    assert 0 <= derive_seed(123, "x") < 2**63


class _NoTemplate:
    chat_template = None

    def encode(self, text, add_special_tokens=True):
        return list(text.encode())


def test_chat_prompt_ids_without_chat_template():
    ids = chat_prompt_ids(_NoTemplate(), [{"role": "user", "content": "hi"}])
    assert bytes(ids).decode() == "user: hi\nassistant: "
