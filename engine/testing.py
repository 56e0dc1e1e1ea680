"""Helpers for tiny random checkpoints, shared by the tests and the benchmarks."""
from __future__ import annotations

from pathlib import Path


def write_char_tokenizer(folder: Path, vocab_size: int) -> None:
    """A tokenizer for a random checkpoint: one token per printable ASCII character (so synthetic
    text prompts work), "<i>" for every other id; EOS is id 1, with a minimal chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {(chr(i) if 32 <= i < 127 else f"<{i}>"): i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<1>", unk_token="<0>", pad_token="<0>")
    fast.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}<assistant>{% endif %}")
    fast.save_pretrained(folder)
