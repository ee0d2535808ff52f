"""Tokenizer wrapper on the tiny preset's byte-level BPE, against transformers."""

from __future__ import annotations

import json

import pytest

from stepserve.model.tokenizer import Tokenizer

TEXTS = ["Hello world", "déjà vu, Größe 東京 服务 🙂", "  spaced  out ", "", "<|im_start|>x"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 🙂"}]


@pytest.fixture(scope="module")
def tok(tiny_dir) -> Tokenizer:
    return Tokenizer(tiny_dir)


@pytest.fixture(scope="module")
def hf_tok(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


def test_encode_decode_match_transformers(tok, hf_tok):
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == hf_tok(text).input_ids
        assert tok.decode(ids) == hf_tok.decode(ids, skip_special_tokens=True)
        assert tok.decode(ids, skip_special_tokens=False) == hf_tok.decode(ids)


def test_chat_template_matches_transformers(tok, hf_tok):
    for gen in (True, False):
        assert tok.apply_chat_template(CHAT, add_generation_prompt=gen) == \
            hf_tok.apply_chat_template(CHAT, add_generation_prompt=gen, tokenize=False)
    assert tok.encode_chat(CHAT)[:1] == [tok.bos_token_id]  # <|im_start|> from the template


def test_eos_ids(tok):
    assert tok.eos_token_ids == (2,) and tok.id_to_token(2) == "<|im_end|>"


def test_incremental_detokenizer_multibyte(tok):
    text = "naïve 東京 🙂 ok"
    ids = tok.encode(text)
    assert len(ids) > len(text) // 2  # byte-level: multi-byte characters span tokens
    detok = tok.detokenizer(prompt_ids=tok.encode("Q: "))
    deltas = [detok.add(t) for t in ids]
    assert "".join(deltas) == text == detok.text
    assert "" in deltas and not any("\ufffd" in d for d in deltas)
    assert detok.output_ids == ids


def test_detokenizer_skips_special_tokens(tok):
    detok = tok.detokenizer()
    out = "".join(detok.add(t) for t in tok.encode("hi") + [2])
    assert out == "hi"


def test_add_bos_token_flag(tiny_dir, tmp_path):
    for name in ("tokenizer.json", "generation_config.json"):
        (tmp_path / name).write_bytes((tiny_dir / name).read_bytes())
    config = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": True}))
    t = Tokenizer(tmp_path)
    assert t.encode("hi")[0] == t.bos_token_id
    assert t.encode("hi", add_special_tokens=False)[0] != t.bos_token_id


def test_missing_chat_template(tiny_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes((tiny_dir / "tokenizer.json").read_bytes())
    with pytest.raises(ValueError, match="chat_template"):
        Tokenizer(tmp_path).apply_chat_template(CHAT)
