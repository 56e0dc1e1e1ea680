from pacore.prompts import (
    CONTROLLER_TEMPLATE,
    chat_prompt_ids,
    last_user_index,
    render_controller_prompt,
    round_messages,
    shuffle_references,
)
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


def test_shuffle_is_reproducible_and_seeded():
    refs = [str(i) for i in range(16)]
    a = shuffle_references(refs, 0, "p1", 1)
    assert a == shuffle_references(refs, 0, "p1", 1)
    assert sorted(a) == sorted(refs)
    assert a != refs
    others = {tuple(shuffle_references(refs, s, p, r)) for s, p, r in [(1, "p1", 1), (0, "p2", 1), (0, "p1", 2)]}
    assert tuple(a) not in others
    assert refs == [str(i) for i in range(16)]


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
