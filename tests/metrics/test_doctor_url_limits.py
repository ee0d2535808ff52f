"""A scrape is bounded whatever the server does: a server that dribbles its answer is
cut off at the scrape's deadline, an endless body or a gzip bomb at the body cap, a page
of too many series before parsing. `doctor --url` reports each like any failed scrape (an
error when every scrape fails, a skipped scrape otherwise), and the bench's scraper,
reading through the same code, counts them as failures. The limits are lowered here."""

from __future__ import annotations

import asyncio
import gzip
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from metrics.canned_texts import rising_vllm_texts, vllm_text
from metrics.test_doctor_url import FAST, doctor

from stepserve.bench.loadgen import Scraper
from stepserve.metrics import bounded_scrape
from stepserve.metrics.bounded_scrape import ScrapeLimits

LIMITS = ScrapeLimits(deadline_s=2.0, max_body_bytes=256 << 10, max_series=1_000)
# what a server that ignores the limits would send at most (a safety net for the test)
SAFETY_BYTES = 4 << 20
GOOD = vllm_text(waiting=1, preempted=0, fast=0, slow=0, stop=3).encode()
PADDING = b"# padding, as a server that never ends its body would send\n"


@pytest.fixture(autouse=True)
def low_limits(monkeypatch):
    monkeypatch.setattr(bounded_scrape, "SCRAPE_LIMITS", LIMITS)


Answer = Callable[[BaseHTTPRequestHandler, threading.Event], None]


def dribble(h: BaseHTTPRequestHandler, done: threading.Event) -> None:
    """Headers, then one byte of the body at a time, half a second apart (30 of them at
    most: then the connection ends, short of its length)."""
    h.send_response(200)
    h.send_header("Content-Length", str(len(GOOD)))
    h.end_headers()
    for byte in GOOD[:30]:
        h.wfile.write(bytes([byte]))
        h.wfile.flush()
        if done.wait(0.5):
            return


def endless(h: BaseHTTPRequestHandler, done: threading.Event) -> None:
    """A body with no length that does not end (up to SAFETY_BYTES)."""
    h.send_response(200)
    h.end_headers()
    chunk = PADDING * 1000
    for _ in range(SAFETY_BYTES // len(chunk)):
        if done.is_set():
            return
        h.wfile.write(chunk)


BOMB = gzip.compress(PADDING * ((32 << 20) // len(PADDING)), compresslevel=9)


def gzip_bomb(h: BaseHTTPRequestHandler, done: threading.Event) -> None:
    """A small gzip body that unpacks to 32 MiB."""
    h.send_response(200)
    h.send_header("Content-Encoding", "gzip")
    h.send_header("Content-Length", str(len(BOMB)))
    h.end_headers()
    h.wfile.write(BOMB)


MANY = GOOD + b"".join(b'vllm:padding{i="%d"} 1\n' % i for i in range(2_000))


def many_series(h: BaseHTTPRequestHandler, done: threading.Event) -> None:
    h.send_response(200)
    h.send_header("Content-Length", str(len(MANY)))
    h.end_headers()
    h.wfile.write(MANY)


def text(body: bytes, compress: bool = False) -> Answer:
    def answer(h: BaseHTTPRequestHandler, done: threading.Event) -> None:
        data = gzip.compress(body) if compress else body
        h.send_response(200)
        if compress:
            h.send_header("Content-Encoding", "gzip")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    return answer


@contextmanager
def server(answers: list[Answer]) -> Iterator[str]:
    """The i-th GET gets answers[i] (the last one again once they run out)."""
    count = iter(range(10**9))
    done = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            try:
                answers[min(next(count), len(answers) - 1)](self, done)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the reader gave up: the point

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        done.set()
        httpd.shutdown()
        httpd.server_close()


CASES = {
    "dribble": (dribble, "did not send its metrics within 2 s, the deadline of a whole "
                         "scrape"),
    "endless": (endless, "sent more than 262,144 bytes of metrics; a scrape reads at most "
                         "that"),
    "gzip_bomb": (gzip_bomb, "sent more than 262,144 bytes of metrics (unpacked)"),
    "many_series": (many_series, "has 2,028 series, more than the 1,000 a scrape reads"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_scrape_past_a_limit_is_one_error(case, capsys):
    answer, message = CASES[case]
    with server([answer]) as url:
        assert doctor("--url", url, *FAST) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("error: ") and message in captured.err


@pytest.mark.parametrize("case", list(CASES))
def test_one_scrape_past_a_limit_is_skipped_and_reported(case, capsys):
    answer, message = CASES[case]
    texts = [text(t.encode()) for t in rising_vllm_texts()]
    with server(texts[:4] + [answer] + texts[5:]) as url:
        assert doctor("--url", url, *FAST) == 0
    out = capsys.readouterr().out
    assert "[critical] capacity" in out  # the findings from the other ten
    assert "window: 10 scrapes" in out
    assert "1 scrape(s) failed and were skipped; the first: scrape 5: " in out
    assert message in out


def test_a_gzip_body_within_the_cap_is_read():
    texts = [text(t.encode(), compress=True) for t in rising_vllm_texts()]
    with server(texts) as url:
        assert doctor("--url", url, *FAST) == 0


def test_the_bench_scraper_reads_through_the_same_limits():
    async def scrape_all(url: str) -> Scraper:
        scraper = Scraper(url + "/metrics")
        async with httpx.AsyncClient() as client:
            for _ in CASES:
                await scraper.scrape_once(client)
        return scraper

    with server([answer for answer, _ in CASES.values()]) as url:
        scraper = asyncio.run(scrape_all(url))
    assert scraper.snapshots == [] and len(scraper.failures) == len(CASES)
    for failure, (_, message) in zip(scraper.failures, CASES.values()):
        assert message in failure
