"""The streaming detokenizer on tokenizers' DecodeStream gives, token for token, the
deltas of our Python window scheme, which it replaced (benchmarks/detok.py: faster):
multi-byte characters held until whole, special tokens skipped or kept, the prompt's
context honoured by a SentencePiece-style decoder."""

from __future__ import annotations

import random

import pytest

from stepserve.model import tokenizer as tokenizer_mod
from stepserve.model.tokenizer import IncrementalDetokenizer, Tokenizer, WindowDetokenizer

TEXTS = ["Hello, world! The capital of France is Paris.",
         "Grüße aus Köln — naïve café, 東京の天気、中文字符 🎉👍🏽🇫🇷 ∑√∞",
         "def f(x):\n    return x ** 2  # 平方\n\n\tTabs\tand  spaces",
         "<|im_start|>assistant\nSure!<|im_end|> after <|endoftext|> tail"]


@pytest.fixture(scope="module")
def tok(tiny_dir) -> Tokenizer:
    return Tokenizer(tiny_dir)


def deltas(kind, tok, prompt: list[int], ids: list[int], skip: bool) -> list[str]:
    detok = kind(tok, prompt, skip)
    return [detok.add(i) for i in ids]


def test_the_engine_gets_the_decodestream_one(tok):
    assert tokenizer_mod.DecodeStream is not None
    assert isinstance(tok.detokenizer([5, 6]), IncrementalDetokenizer)


@pytest.mark.parametrize("skip", [True, False])
def test_same_deltas_as_the_window_scheme_and_the_whole_decode(tok, skip):
    prompt = tok.encode("Answer: ", add_special_tokens=False)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        stream = deltas(IncrementalDetokenizer, tok, prompt, ids, skip)
        assert stream == deltas(WindowDetokenizer, tok, prompt, ids, skip)
        assert "".join(stream) == tok.decode(ids, skip_special_tokens=skip)
        assert not any("\ufffd" in d for d in stream)
    held = deltas(IncrementalDetokenizer, tok, prompt, tok.encode("🎉", False), skip)
    assert held[:-1] == [""] * (len(held) - 1) and held[-1] == "🎉"  # whole or nothing


def test_special_tokens_skipped_or_kept(tok):
    ids = tok.encode("hi", add_special_tokens=False) + [2]  # <|im_end|>
    skipped = tok.detokenizer(skip_special_tokens=True)
    kept = tok.detokenizer(skip_special_tokens=False)
    assert "".join(skipped.add(i) for i in ids) == "hi" == skipped.text
    assert "".join(kept.add(i) for i in ids) == "hi<|im_end|>" == kept.text
    assert kept.output_ids == ids


def test_random_token_streams_decode_as_a_whole(tok):
    """Garbage streams (broken UTF-8 anywhere, prompts ending mid-character): the deltas
    add up to decoding the output alone. (The window scheme missed this on ~1% of them:
    a broken character spanning prompt and output lost its U+FFFD.)"""
    rng = random.Random(0)
    checked = 0
    for _ in range(300):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 30))]
        prompt = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 8))]
        for skip in (True, False):
            whole = tok.decode(ids, skip_special_tokens=skip)
            if whole.endswith("\ufffd"):  # ends mid-character: the tail is held back
                continue
            checked += 1
            assert "".join(deltas(IncrementalDetokenizer, tok, prompt, ids, skip)) == whole
    assert checked > 300


def test_a_prompt_ending_mid_character_keeps_its_broken_character(tok):
    first, *rest = tok.encode("東京", add_special_tokens=False)  # 東 spans tokens
    assert tok.decode([first]).endswith("\ufffd")
    prompt = tok.encode("Say ", add_special_tokens=False) + [first]
    stream = deltas(IncrementalDetokenizer, tok, prompt, rest, True)
    assert "".join(stream) == tok.decode(rest) == "\ufffd\ufffd京"
    # the window scheme completes the prompt's character and drops it from the output
    assert "".join(deltas(WindowDetokenizer, tok, prompt, rest, True)) == "京"


class _SentencePieceLike(Tokenizer):
    """A Llama-2-style tokenizer (Metaspace, a decoder that strips the first space),
    trained here on a few words: no file, no download."""

    def __init__(self) -> None:
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, normalizers, trainers

        hf = HFTokenizer(models.BPE(unk_token="<unk>"))
        hf.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                              normalizers.Replace(" ", "▁")])
        hf.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(),
                                        decoders.Strip(" ", 1, 0)])
        trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"])
        hf.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainer)
        self._tok = hf


def test_prompt_context_keeps_the_leading_space_of_a_sentencepiece_decoder():
    tok = _SentencePieceLike()
    prompt = tok._tok.encode("the fox").ids
    ids = tok._tok.encode("jumps over").ids
    whole = tok.decode(prompt + ids)[len(tok.decode(prompt)):]
    assert whole == " jumps over"
    for kind in (IncrementalDetokenizer, WindowDetokenizer):
        assert "".join(deltas(kind, tok, prompt, ids, True)) == whole
    # without the prompt's context the first space is lost, as the decoder strips it
    assert "".join(deltas(IncrementalDetokenizer, tok, [], ids, True)) == "jumps over"
