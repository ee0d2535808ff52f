"""Fixtures for the bench tests: our own server over the tiny model (tests/server's
harness) and a small fake OpenAI-compatible server whose failures we control."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

sys.path.insert(0, str(Path(__file__).parent.parent / "server"))
sys.path.insert(0, str(Path(__file__).parent))

from fake_server import FakeServer, run_fake  # noqa: E402
from server_harness import Served, serve  # noqa: E402


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    # usage's cached_tokens (the bench's hit rate) needs the flag, as on vLLM
    with serve(enable_prompt_tokens_details=True) as s:
        yield s


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    with run_fake() as f:
        yield f
