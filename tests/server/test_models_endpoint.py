"""/v1/models as vLLM answers it: a card per served name, `root` the model's folder (so
`vllm bench serve` finds the tokenizer without --model or --tokenizer), `parent`, a
permission, max_model_len; a request may give any served name as `model`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import openai
from server_harness import MODEL, serve_process

from stepserve.model.presets import resolve_model


def test_every_served_name_is_a_card_with_the_models_folder_as_root():
    with serve_process("--served-model-name", "first", "second") as server:
        body = httpx.get(server.url + "/v1/models").json()
        assert [card["id"] for card in body["data"]] == ["first", "second"]
        for card in body["data"]:
            assert card["root"] == str(resolve_model(MODEL)) and card["parent"] is None
            assert card["max_model_len"] == 256 and card["owned_by"] == "stepserve"
            (permission,) = card["permission"]
            assert permission["object"] == "model_permission"
            assert permission["allow_sampling"] and permission["allow_logprobs"]
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        answer = client.completions.create(model="second", prompt="Hi", max_tokens=2)
        assert answer.model == "first"  # as vLLM: answers carry the first name
        try:
            client.completions.create(model="third", prompt="Hi", max_tokens=2)
        except openai.NotFoundError as e:
            assert "'first', 'second'" in str(e)
        else:
            raise AssertionError("an unknown model was served")


VLLM_MODELS = Path(__file__).parent.parent / "fixtures" / "vllm-0.32.0" / "v1_models.json"


def _shape(value):
    """A JSON value's keys and kinds, recursively (lists by their first item)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


def test_a_card_has_the_shape_of_vllms_own():
    theirs = json.loads(VLLM_MODELS.read_text())  # vLLM 0.32.0's answer, captured
    with serve_process("--served-model-name", "smollm2") as server:
        ours = httpx.get(server.url + "/v1/models").json()
    assert _shape(ours) == _shape(theirs)
    assert re.fullmatch(r"modelperm-[0-9a-f]{16}", ours["data"][0]["permission"][0]["id"])
