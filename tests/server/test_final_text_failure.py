"""A request whose final answer cannot be built (its text fails) is answered with an
error and counted as ended by an error, not under the engine's own reason."""

from __future__ import annotations

import openai
import pytest
from server_harness import MODEL, make_engine, serve

from stepserve.engine.outputs import SequenceState


def test_a_failed_final_text_is_an_error_answer_and_counted_as_one(monkeypatch):
    final_text = SequenceState.final_text

    def breaking(state, tokenizer):
        if state.request.sampling_params.max_tokens == 5:  # the sabotaged request
            raise RuntimeError("injected final-text fault")
        return final_text(state, tokenizer)

    engine = make_engine()
    monkeypatch.setattr(SequenceState, "final_text", breaking)
    with serve(engine) as served:
        client = served.client()
        counted = {r: served.metric("stepserve:request_success_total", finished_reason=r)
                   for r in ("length", "error")}
        with pytest.raises(openai.InternalServerError) as err:
            client.completions.create(model=MODEL, prompt="hello", max_tokens=5)
        assert "the final text failed" in str(err.value)
        ok = client.completions.create(model=MODEL, prompt="hello", max_tokens=4)
        assert ok.choices[0].finish_reason == "length"
        served.wait_idle()
        after = {r: served.metric("stepserve:request_success_total", finished_reason=r)
                 for r in ("length", "error")}
    # the sabotaged request ended by length in the engine, but its client got an error
    assert after["error"] - counted["error"] == 1
    assert after["length"] - counted["length"] == 1
