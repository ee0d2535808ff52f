"""/v1/models as vLLM answers it: a card per served name, `root` the model's folder (so
`vllm bench serve` finds the tokenizer without --model or --tokenizer), `parent`, a
permission, max_model_len; a request may give any served name as `model`."""

from __future__ import annotations

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
