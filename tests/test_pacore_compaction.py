import pytest

from pacore.budget import PromptTooLong, fit_round_prompt
from pacore.compaction import compact, keep_last_tokens
from pacore_fakes import FakeTokenizer


def test_text_after_last_think_end():
    c = compact("<think>a</think>mid</think>\n  The answer is 4.  \n")
    assert c.message == "The answer is 4."
    assert c.reasoning == "a</think>mid"


def test_no_think_end_keeps_whole_text():
    c = compact("  just an answer \n")
    assert c.message == "just an answer"
    assert c.reasoning == ""


def test_reasoning_without_opening_tag():
    c = compact("<think>\nlet me see\n</think>\n\n42")
    assert (c.message, c.reasoning) == ("42", "let me see")
    assert c.to_record() == {"content": "42", "reasoning_content": "let me see"}


def test_empty_conclusion():
    assert compact("<think>long thought</think>   ").message == ""
    assert compact("").message == ""


def test_keep_last_tokens_keeps_the_end():
    tok = FakeTokenizer()
    assert keep_last_tokens("abcdef", tok, 3) == ("def", True)
    assert keep_last_tokens("abc", tok, 3) == ("abc", False)


MSGS = [{"role": "user", "content": "Q?"}]


def _len(msgs_refs):
    from pacore.prompts import chat_prompt_ids, round_messages

    return len(chat_prompt_ids(FakeTokenizer(), round_messages(MSGS, msgs_refs)))


def test_fit_without_refs_and_too_long_problem():
    tok = FakeTokenizer()
    p = fit_round_prompt(tok, MSGS, [], max_model_len=100, max_tokens=10, message_token_cap="auto")
    assert len(p.token_ids) == _len([]) and p.max_tokens == 10 and p.truncated_messages == 0
    with pytest.raises(PromptTooLong, match="exceeds the context"):
        fit_round_prompt(tok, MSGS, [], max_model_len=len(p.token_ids) + 9, max_tokens=10, message_token_cap="auto")


def test_auto_cap_fits_exactly_and_keeps_ends():
    tok = FakeTokenizer()
    refs = ["x" * 300 + "END1", "y" * 300 + "END2", "short"]
    full = _len(refs)
    limit = full - 200
    p = fit_round_prompt(tok, MSGS, refs, max_model_len=limit, max_tokens=50, message_token_cap="auto")
    assert len(p.token_ids) + 50 <= limit
    text = tok.decode(p.token_ids)
    assert "END1" in text and "END2" in text and "short" in text
    assert p.truncated_messages == 2


def test_explicit_cap_and_none():
    tok = FakeTokenizer()
    refs = ["a" * 50, "b" * 5]
    p = fit_round_prompt(tok, MSGS, refs, max_model_len=10_000, max_tokens=10, message_token_cap=8)
    assert p.truncated_messages == 1
    assert len(p.token_ids) == _len(["a" * 8, "b" * 5])
    with pytest.raises(PromptTooLong, match="message-token-cap"):
        fit_round_prompt(tok, MSGS, refs, max_model_len=_len(refs) + 5, max_tokens=10, message_token_cap=None)


def test_auto_cap_impossible():
    tok = FakeTokenizer()
    with pytest.raises(PromptTooLong, match="even with references cut"):
        fit_round_prompt(tok, MSGS, ["abc"] * 4, max_model_len=_len([""] * 4) + 10, max_tokens=10,
                         message_token_cap="auto")
