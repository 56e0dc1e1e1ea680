import pytest

from pacore.budget import PromptTooLong, check_max_tokens, fit_round_prompt, reserved_room
from pacore.compaction import Compacted, Trajectory, compact, keep_last_tokens, reference_text
from pacore_fakes import FakeTokenizer


# Input -> reference text, as the reference pipeline's parse_answer gives them (stepfun-ai/PaCoRe,
# pacore/batch_inference/base_exp.py): after the last </think>, unstripped; the whole text without one.
REFERENCE_CASES = [
    ("<think>\nr\n</think>\n\nX", "\n\nX"),
    ("a</think>b</think>\n\nfinal", "\n\nfinal"),
    ("r</think>   \n", "   \n"),
    ("  plain \n", "  plain \n"),
    ("r</think>", ""),
    ("", ""),
]


@pytest.mark.parametrize("text,expected", REFERENCE_CASES)
def test_reference_text_byte_for_byte(text, expected):
    assert reference_text(text) == expected
    assert reference_text(text) == text.split("</think>")[-1]  # the reference's own expression
    assert Trajectory(0, text).message == expected


def test_emptiness_is_judged_on_the_raw_text():
    # kept: the raw text is not empty, even when nothing (or only blanks) follows </think>
    assert Trajectory(0, "r</think>   \n").passes_on
    assert Trajectory(0, "r</think>").passes_on and Trajectory(0, "r</think>").message == ""
    assert not Trajectory(0, "").passes_on


def test_record_holds_the_reference_keys_then_ours():
    t = Trajectory(3, "<think>\nr\n</think>\n\nX", "stop", 12)
    rec = t.to_record()
    assert list(rec)[:2] == ["content", "reasoning_content"]
    assert rec == {"content": "<think>\nr\n</think>\n\nX", "reasoning_content": "", "index": 3,
                   "finish_reason": "stop", "tokens": 12}
    assert Trajectory.from_record(rec, 0) == t
    assert Trajectory.from_record({"content": "x", "reasoning_content": ""}, 5) == Trajectory(5, "x")


def test_compact_splits_reasoning_and_keeps_the_message_exact():
    c = compact("<think>\nlet me see\n</think>\n\n42")
    assert (c.message, c.reasoning) == ("\n\n42", "let me see")
    assert compact("<think>a</think>mid</think> 4 ").reasoning == "a</think>mid"
    assert compact("  just an answer \n") == Compacted("  just an answer \n", "")


def test_keep_last_tokens_keeps_the_end():
    tok = FakeTokenizer()
    assert keep_last_tokens("abcdef", tok, 3) == ("def", 3)
    assert keep_last_tokens("abc", tok, 3) == ("abc", 0)
    assert keep_last_tokens(" ab", tok, 2) == ("ab", 1)
    assert keep_last_tokens("a c", tok, 2) == (" c", 1)  # not stripped


MSGS = [{"role": "user", "content": "Q?"}]


def _len(refs):
    from engine.chat import chat_prompt_ids
    from pacore.prompts import round_messages

    return len(chat_prompt_ids(FakeTokenizer(), round_messages(MSGS, refs or [], empty_bypasses=refs is None)))


def test_fit_without_refs_and_too_long_problem():
    tok = FakeTokenizer()
    p = fit_round_prompt(tok, MSGS, None, max_model_len=100, max_tokens=10, message_token_cap="auto")
    assert len(p.token_ids) == _len(None) and p.max_tokens == 10 and p.truncated_messages == 0
    with pytest.raises(PromptTooLong, match="exceeds the context"):
        fit_round_prompt(tok, MSGS, None, max_model_len=len(p.token_ids) + 9, max_tokens=10, message_token_cap="auto")


def test_later_round_without_references_still_uses_the_template():
    # the reference pipeline renders the controller prompt in every round after the first
    tok = FakeTokenizer()
    p = fit_round_prompt(tok, MSGS, [], max_model_len=1000, max_tokens=10, message_token_cap="auto")
    text = tok.decode(p.token_ids)
    assert "Reference Responses:\n\n\nNow, based on" in text and "Reference 1" not in text


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
    assert p.truncated_tokens == full - len(p.token_ids)  # one token per character


def test_explicit_cap_and_none():
    tok = FakeTokenizer()
    refs = ["a" * 50, "b" * 5]
    p = fit_round_prompt(tok, MSGS, refs, max_model_len=10_000, max_tokens=10, message_token_cap=8)
    assert (p.truncated_messages, p.truncated_tokens) == (1, 42)
    assert len(p.token_ids) == _len(["a" * 8, "b" * 5])
    with pytest.raises(PromptTooLong, match="message-token-cap"):
        fit_round_prompt(tok, MSGS, refs, max_model_len=_len(refs) + 5, max_tokens=10, message_token_cap=None)


def test_auto_cap_impossible():
    tok = FakeTokenizer()
    with pytest.raises(PromptTooLong, match="even with references cut"):
        fit_round_prompt(tok, MSGS, ["abc"] * 4, max_model_len=_len([""] * 4) + 10, max_tokens=10,
                         message_token_cap="auto")


def test_auto_budget_is_the_context_minus_the_prompt():
    tok = FakeTokenizer()
    p = fit_round_prompt(tok, MSGS, None, max_model_len=500, max_tokens="auto", message_token_cap="auto")
    assert p.max_tokens == 500 - _len(None) and len(p.token_ids) == _len(None)
    # a problem that leaves a single token still runs; one that leaves none is refused
    p = fit_round_prompt(tok, MSGS, None, max_model_len=_len(None) + 1, max_tokens="auto", message_token_cap="auto")
    assert p.max_tokens == 1
    with pytest.raises(PromptTooLong, match="leaves no token to generate"):
        fit_round_prompt(tok, MSGS, None, max_model_len=_len(None), max_tokens="auto", message_token_cap="auto")


def test_auto_budget_cuts_references_only_to_leave_a_quarter_of_the_context():
    tok = FakeTokenizer()
    refs = ["x" * 200 + "END1", "y" * 200 + "END2"]
    full = _len(refs)
    roomy = 4 * full  # the full prompt leaves 3/4 of the context: untouched
    p = fit_round_prompt(tok, MSGS, refs, max_model_len=roomy, max_tokens="auto", message_token_cap="auto")
    assert (p.truncated_messages, p.truncated_tokens, p.max_tokens) == (0, 0, roomy - full)
    tight = full + 50  # the full prompt would leave 50 tokens, less than a quarter
    p = fit_round_prompt(tok, MSGS, refs, max_model_len=tight, max_tokens="auto", message_token_cap="auto")
    assert p.truncated_messages == 2 and p.max_tokens >= reserved_room(tight) == tight // 4
    assert len(p.token_ids) + p.max_tokens == tight
    assert p.truncated_tokens == full - len(p.token_ids)
    assert "END1" in tok.decode(p.token_ids) and "END2" in tok.decode(p.token_ids)
    # --message-token-cap none: nothing is cut, the trajectory gets what the references leave
    p = fit_round_prompt(tok, MSGS, refs, max_model_len=tight, max_tokens="auto", message_token_cap=None)
    assert (p.truncated_messages, p.max_tokens, len(p.token_ids)) == (0, 50, full)


def test_a_fixed_budget_that_never_fits_is_refused():
    check_max_tokens(99, 100)
    check_max_tokens("auto", 100)
    with pytest.raises(ValueError, match="--max-tokens 100 leaves no room.*--max-tokens auto"):
        check_max_tokens(100, 100)
