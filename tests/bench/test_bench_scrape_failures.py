"""`stepserve bench` against a target whose /metrics fails (HTTP 500, garbage text, a
connection dropped mid-answer): the run goes on, the failed scrapes are skipped and
counted in the summary, and no traceback reaches the user."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from fake_server import make_app
from server_harness import free_port, wait_until_up

from stepserve.bench.loadgen import Scraper
from stepserve.cli import main
from stepserve.metrics.prometheus import parse_prometheus

SMALL = ["--random-input-len", "4", "--random-output-len", "8", "--no-progress"]
METRICS = (b"# TYPE vllm:num_requests_running gauge\n"
           b'vllm:num_requests_running{model_name="fake"} 0\n'
           b"# TYPE vllm:num_requests_waiting gauge\n"
           b'vllm:num_requests_waiting{model_name="fake"} 0\n')
GARBAGE = b"\xff\xfe{{{ not prometheus\n\x00\x01 vllm:num_requests_running{model_name=\"x 1\n"
UNPARSABLE = b'1{, ==}e.11}a=e{"#'  # prometheus_client's parser raised IndexError on it


def with_metrics(app, plan: list[str], served: list[str]):
    """`app` with a /metrics whose n-th answer is plan[n] ("ok" once the plan is used
    up): "ok", "500", "garbage", "unparsable" or "drop" (the connection closed
    mid-answer)."""

    async def asgi(scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/metrics":
            return await app(scope, receive, send)
        kind = plan[len(served)] if len(served) < len(plan) else "ok"
        served.append(kind)
        status = 500 if kind == "500" else 200
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; version=0.0.4")]})
        if kind == "drop":  # a half-sent body, then the server gives up on the connection
            await send({"type": "http.response.body", "body": METRICS[:20],
                        "more_body": True})
            raise ConnectionResetError("metrics connection dropped (on purpose)")
        body = {"garbage": GARBAGE, "unparsable": UNPARSABLE, "500": b"boom"}.get(kind, METRICS)
        await send({"type": "http.response.body", "body": body})

    return asgi


@contextmanager
def failing_metrics_target(plan: list[str], hold_for_scrapes: int = 0
                           ) -> Iterator[tuple[str, list[str]]]:
    """`hold_for_scrapes`: no stream is answered before /metrics was asked that often
    (the run lasts until then, however fast or slow the machine)."""
    served: list[str] = []
    settings = {"delay_s": 0.02}
    if hold_for_scrapes:
        settings["hold_until"] = lambda: len(served) >= hold_for_scrapes
    app = with_metrics(make_app(settings), plan, served)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_until_up(url, "/health", timeout_s=30, alive=thread.is_alive)
    try:
        yield url, served
    finally:
        server.should_exit = True
        thread.join(10)


def bench(url: str, tmp_path, capsys, *extra: str) -> tuple[dict, str]:
    out = tmp_path / "r.json"
    rc = main(["bench", "--target", url, *SMALL, "--num-prompts", "12",
               "--max-concurrency", "2", "--metrics-interval-s", "0.1", *extra,
               "--json", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "Traceback" not in captured.out + captured.err
    return json.loads(out.read_text())["runs"][0]["summary"], captured.out


def test_failed_scrapes_mid_run_are_skipped_and_counted(tmp_path, capsys):
    plan = ["ok", "500", "garbage", "drop"]
    # the run goes on until one scrape after the failures (then one more once it ends)
    with failing_metrics_target(plan, hold_for_scrapes=len(plan) + 1) as (url, served):
        s, printed = bench(url, tmp_path, capsys)
    assert served[:4] == plan and len(served) >= 6  # it went on scraping after them
    assert s["requests_finished"] == 12 and s["requests_failed"] == 0
    assert s["scrape_failures"] == 3
    assert s["scrape_error"].startswith("scrape 2: ") and "answered HTTP 500" in s["scrape_error"]
    assert s["scrape_samples"] == len(served) - 3 and s["metrics_source"] == "vllm"
    assert s["running_max"] == 0
    assert "scrape_failures" in printed and "HTTP 500" in printed


def test_a_target_whose_metrics_never_work_is_run_without_them(tmp_path, capsys):
    with failing_metrics_target(["drop", "unparsable"] + ["500"] * 50) as (url, served):
        s, printed = bench(url, tmp_path, capsys)
    assert served == ["drop", "unparsable"]  # the first scrape, tried twice, then no more
    assert s["requests_finished"] == 12
    assert s["scrape_samples"] == 0 and s["metrics_source"] is None
    assert s["scrape_failures"] == 2 and "RemoteProtocolError" in s["scrape_error"]
    assert "scrape_failures" in printed


def test_scraper_reads_each_kind_of_failure():
    async def scrape_all(url: str) -> Scraper:
        scraper = Scraper(url + "/metrics")
        async with httpx.AsyncClient() as client:
            for _ in range(5):
                await scraper.scrape_once(client)
        return scraper

    with failing_metrics_target(["500", "garbage", "drop", "unparsable", "ok"]) as (url, _):
        scraper = asyncio.run(scrape_all(url))
    assert len(scraper.snapshots) == 1 and scraper.attempts == 5
    assert [f.split(":")[0] for f in scraper.failures] == [f"scrape {k}" for k in (1, 2, 3, 4)]
    assert "HTTP 500" in scraper.failures[0] and "known prefix" in scraper.failures[1]
    assert "RemoteProtocolError" in scraper.failures[2]
    assert "known prefix" in scraper.failures[3]
    assert scraper.summary()["scrape_failures"] == 4
    assert parse_prometheus(UNPARSABLE.decode()) == {}  # no IndexError out of the parser
