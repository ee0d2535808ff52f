"""Text that is not valid Unicode, and stop tokens that leave nothing to sample, refused
off the server as on it: `stepserve generate` (one `error:` line, exit 2, before the model
loads; a byte of argv that is not UTF-8 arrives as a lone surrogate) and the offline
engine (ValueError, nothing queued). The checks are request_limits' own."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stepserve import LLM, SamplingParams
from stepserve.cli import main
from stepserve.core.request_limits import check_text, stop_tokens_refusal

TINY_VOCAB, TINY_EOS = 512, 2


@pytest.mark.parametrize("text", ["plain", "café", "\U0001F600 emoji", ""])
def test_valid_text_passes(text):
    assert check_text("prompt", text) is None


@pytest.mark.parametrize("text, where, code", [
    ("ab\ud800cd", 2, "U+D800"), ("\udfff", 0, "U+DFFF"), ("ok\udcff", 2, "U+DCFF"),
])
def test_a_lone_surrogate_is_named_by_field_index_and_code_point(text, where, code):
    problem = check_text("messages.0.content", text)
    assert problem.startswith("messages.0.content: ")
    assert f"index {where}" in problem and code in problem
    problem.encode("utf-8")  # the message itself can be printed and sent


def test_an_undecodable_argv_byte_is_explained():
    assert "byte 0xFF" in check_text("--prompt", "ab\udcffcd")
    assert "byte" not in check_text("--prompt", "ab\ud800cd")


def test_stop_tokens_with_eos_over_the_whole_vocabulary_are_refused_under_min_tokens():
    all_but_eos = [t for t in range(TINY_VOCAB) if t != TINY_EOS]
    assert "whole vocabulary" in stop_tokens_refusal(all_but_eos, 1, TINY_VOCAB, TINY_EOS)
    # without min_tokens nothing is masked: every token simply stops
    assert stop_tokens_refusal(all_but_eos, 0, TINY_VOCAB, TINY_EOS) is None
    # one token left to sample is enough
    assert stop_tokens_refusal(all_but_eos[1:], 3, TINY_VOCAB, TINY_EOS) is None
    # a model without EOS: the stop ids alone must cover the vocabulary
    assert stop_tokens_refusal(all_but_eos, 1, TINY_VOCAB, None) is None
    assert stop_tokens_refusal(list(range(TINY_VOCAB)), 1, TINY_VOCAB, None) is not None
    assert "[0, 512)" in stop_tokens_refusal([5, 512], 0, TINY_VOCAB, TINY_EOS)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_model_len=128, max_num_seqs=4)


def test_offline_generate_refuses_stop_tokens_that_leave_nothing_to_sample(llm):
    all_but_eos = [t for t in range(TINY_VOCAB) if t != TINY_EOS]
    params = SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=all_but_eos)
    with pytest.raises(ValueError, match="whole vocabulary"):
        llm.generate("hello", params, use_tqdm=False)
    with pytest.raises(ValueError, match=r"\[0, 512\)"):
        llm.generate("hello", SamplingParams(max_tokens=4, stop_token_ids=[600]),
                     use_tqdm=False)
    assert not llm.engine.has_unfinished() and llm.scheduler.kv.all_free


def test_offline_generate_refuses_a_lone_surrogate(llm):
    with pytest.raises(ValueError, match="lone surrogate"):
        llm.generate("ab\ud800cd", SamplingParams(max_tokens=2), use_tqdm=False)
    assert not llm.engine.has_unfinished()
    out = llm.generate("abcd", SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2


@pytest.mark.parametrize("flags, needle", [
    (["--prompt", "ab\ud800cd"], "--prompt: the character at index 2"),
    (["--prompt", "hi", "--stop", "x", "--stop", "\udc80"], "--stop: "),
])
def test_generate_refuses_a_lone_surrogate_in_one_line(flags, needle, capsys):
    # an unknown model: the text is refused before anything loads
    assert main(["generate", "--model", "not-loaded", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and needle in err, err


def test_generate_refuses_argv_bytes_that_are_not_utf8():
    code = "import sys\nfrom stepserve.cli import main\nsys.exit(main(sys.argv[1:]))"
    run = subprocess.run([sys.executable, "-c", code, "generate", "--model", "not-loaded",
                          "--prompt", b"ab\xffcd"], capture_output=True, timeout=120)
    err = run.stderr.decode()
    assert run.returncode == 2, err
    assert err.count("\n") == 1 and "--prompt" in err and "byte 0xFF" in err, err
