"""`priority` is taken only under the priority policy; otherwise a 400, as vLLM answers
("Got priority ... but Priority scheduling is not enabled")."""

import httpx
from server_harness import make_engine, serve


def completion(url: str, **fields) -> httpx.Response:
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 2, **fields}
    return httpx.post(url + "/v1/completions", json=body, timeout=60)


def test_priority_under_fcfs_is_a_400_naming_the_policy():
    with serve(make_engine(policy="fcfs")) as s:
        r = completion(s.url, priority=1)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "priority" and "'fcfs'" in err["message"]
        assert "--scheduling-policy priority" in err["message"]
        assert completion(s.url, priority=0).status_code == 200  # the default is fine


def test_priority_under_the_priority_policy_is_taken():
    with serve(make_engine(policy="priority")) as s:
        r = completion(s.url, priority=3)
        assert r.status_code == 200, r.text
