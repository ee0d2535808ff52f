"""Fixtures for the server tests (helpers in server_harness.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")
pytest.importorskip("prometheus_client")

sys.path.insert(0, str(Path(__file__).parent))

from server_harness import BASE_SETTINGS, MODEL, Served, serve  # noqa: E402


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with serve() as s:
        yield s


@pytest.fixture(scope="session")
def offline_llm():
    """The same model offline (LLM.generate), for text equality."""
    from stepserve import LLM

    return LLM(MODEL, **BASE_SETTINGS)
