"""vLLM's SamplingParams fields beyond OpenAI's (issue 47): min_tokens, include_stop_str_in_output,
skip_special_tokens, and add_request's cache_salt, on the tiny checkpoint (one token per character;
id 1 is EOS, "<1>", id 0 "<0>", both special). logit_bias +100 makes greedy choose the token it names."""
import pytest

from engine import LLM, SamplingParams

EOS, PAD, A = 1, 0, ord("A")


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=256)


def _run(llm, prompt="hello", **kw):
    (out,) = llm.generate([prompt], SamplingParams(temperature=0, **kw), use_tqdm=False)
    return out.outputs[0]


def test_min_tokens_holds_back_eos_and_stop_tokens(llm):
    assert len(_run(llm, max_tokens=8, logit_bias={EOS: 100}).token_ids) == 1  # EOS at once
    out = _run(llm, max_tokens=8, min_tokens=3, logit_bias={EOS: 100})
    assert len(out.token_ids) == 4 and out.token_ids[3] == EOS and EOS not in out.token_ids[:3]
    assert out.finish_reason == "stop"
    out = _run(llm, max_tokens=8, min_tokens=2, logit_bias={A: 100}, stop_token_ids=[A])
    assert len(out.token_ids) == 3 and out.token_ids[2] == A and A not in out.token_ids[:2]
    out = _run(llm, max_tokens=5, min_tokens=5, logit_bias={EOS: 100}, ignore_eos=True)
    assert out.token_ids == [EOS] * 5  # ignore_eos: EOS is no stop token, so nothing is held back


def test_min_tokens_looks_for_stop_strings_only_from_then_on(llm):
    out = _run(llm, max_tokens=6, min_tokens=3, logit_bias={A: 100}, stop=["A"])
    assert out.token_ids == [A] * 3 and out.text == "AA" and out.finish_reason == "stop"
    with pytest.raises(ValueError, match="min_tokens must be at most max_tokens"):
        SamplingParams(max_tokens=2, min_tokens=3)


def test_include_stop_str_in_output_keeps_the_stop(llm):
    assert _run(llm, max_tokens=4, logit_bias={A: 100}, stop=["A"]).text == ""
    assert _run(llm, max_tokens=4, logit_bias={A: 100}, stop=["A"], include_stop_str_in_output=True).text == "A"
    assert _run(llm, max_tokens=4, logit_bias={A: 100}, stop_token_ids=[A]).text == ""
    out = _run(llm, max_tokens=4, logit_bias={A: 100}, stop_token_ids=[A], include_stop_str_in_output=True)
    assert out.text == "A" and out.token_ids == [A]


def test_skip_special_tokens_false_keeps_their_text(llm):
    assert _run(llm, max_tokens=3, logit_bias={PAD: 100}).text == ""
    assert _run(llm, max_tokens=3, logit_bias={PAD: 100}, skip_special_tokens=False).text == "<0><0><0>"


def test_cache_salt_shares_blocks_only_within_one_salt(llm):
    prompt = "a prompt of several KV blocks, " * 3  # 93 tokens: 5 full blocks of 16

    def hits(**kw):
        before = llm.stats()["prefix_cache_hit_tokens"]
        llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=1), **kw)
        while llm.has_unfinished():
            llm.step()
        return llm.stats()["prefix_cache_hit_tokens"] - before
    hits(cache_salt="s1")
    assert hits(cache_salt="s1") == 80
    assert hits(cache_salt="s2") == 0 and hits() == 0
    assert hits() == 80
    with pytest.raises(ValueError, match="cache_salt"):
        llm.add_request(prompt, SamplingParams(), cache_salt="")


class _Chars:
    """A tokenizer of one character per token (its code point)."""
    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def _stops_after(text: str, **kw) -> tuple[int, str]:
    """Feeds ``text`` token by token through the StopChecker: (tokens generated when it stopped, final text)."""
    from types import SimpleNamespace
    from engine.core.stopping import StopChecker
    checker = StopChecker(_Chars(), eos_token_ids=[EOS], max_model_len=256)
    seq = SimpleNamespace(params=SamplingParams(max_tokens=len(text), **kw), token_ids=[ord("p")], num_prompt_tokens=1,
                          finish_reason=None)
    for ch in text:
        seq.token_ids.append(ord(ch))
        seq.num_generated, seq.num_tokens, seq.generated = len(seq.token_ids) - 1, len(seq.token_ids), seq.token_ids[1:]
        seq.finish_reason = checker.check(seq)
        if seq.finish_reason:
            break
    return seq.num_generated, checker.final_text(seq)


def test_min_tokens_neither_stops_at_an_earlier_stop_string_nor_cuts_the_text_there():
    # A stop string wholly inside the first min_tokens tokens is text: it neither stops the trajectory
    # when min_tokens is reached nor cuts the final text (it used to do both).
    assert _stops_after("Xabcd", min_tokens=3, stop=["X"]) == (5, "Xabcd")
    assert _stops_after("XabXcd", min_tokens=3, stop=["X"]) == (4, "Xab")
    assert _stops_after("abcwxyzq", min_tokens=4, stop=["ab", "wxyz"]) == (7, "abc")
    assert _stops_after("abcwxyzq", min_tokens=4, stop=["ab", "wxyz"], include_stop_str_in_output=True) == (7, "abcwxyz")
    assert _stops_after("abab", min_tokens=3, stop=["ab"]) == (4, "ab")  # one that ends at token 4
    assert _stops_after("abcab", stop=["ab"]) == (2, "")
