"""Streamed text (engine/serve/text.py): what is released is always the start of the final text."""
import random

import pytest

from engine.serve.text import IncrementalText
from engine.sample.stop_strings import StopStrings


def _final(tokenizer, ids, stops):
    """The engine's final text: the decoded tokens cut before the first stop string."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    cuts = [text.find(s) for s in stops if s in text]
    return text[:min(cuts)] if cuts else text


def _check_stream(tokenizer, ids, stops):
    inc, sent = IncrementalText(tokenizer, StopStrings(stops)), ""
    final = _final(tokenizer, ids, stops)
    for i, token in enumerate(ids):
        sent += inc.feed([token])
        assert final.startswith(sent), (sent, final)
    assert sent + inc.rest(final) == final
    return sent


def test_a_tail_that_may_become_a_stop_string_is_held_until_decided(tiny_model_dir):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_model_dir("llama"))  # one token per character
    inc = IncrementalText(tok, StopStrings(["STOP"]))
    assert inc.feed(tok.encode("abcSTO")) == "abc"  # "STO" may be the start of "STOP"
    assert inc.feed(tok.encode("X")) == "STOX"
    assert inc.feed(tok.encode("ST")) == ""
    assert inc.feed(tok.encode("OP")) == ""  # "STOP" itself is never released
    assert inc.rest("abcSTOXST") == "ST" and inc.seen == 11


@pytest.mark.slow
def test_byte_level_text_is_released_only_in_whole_characters():
    from transformers import AutoTokenizer

    from engine.default_model import resolve_model
    tok = AutoTokenizer.from_pretrained(resolve_model(None))  # SmolLM2: byte-level BPE
    text = "Héllo wörld 😀 你好, the answer is \\boxed{42}. Done 🎉🎉"
    ids = tok.encode(text, add_special_tokens=False)
    for stops in ([], ["answer"], ["\\boxed", "zz"], ["😀"], ["🎉"]):
        sent = _check_stream(tok, ids, stops)
        assert "\ufffd" not in sent
    rng = random.Random(0)
    for _ in range(100):  # any tokens, including ones that are not valid UTF-8 on their own
        _check_stream(tok, [rng.randrange(len(tok)) for _ in range(40)], rng.choice([[], ["e"], ["th", "in"]]))


def test_new_tokens_are_the_tails_of_partial_outputs(tiny_model_dir):
    from engine import LLM, SamplingParams
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=256)
    rid = llm.add_request("abc", SamplingParams(n=3, max_tokens=5, seed=1, ignore_eos=True))
    for _ in range(3):
        llm.step()
    full = llm.partial_outputs(rid)
    seen = [1, 0, 2]
    assert llm.new_tokens(rid, seen) == [(tokens[k:], reason) for (tokens, reason), k in zip(full, seen)]
