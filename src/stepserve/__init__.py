"""stepserve: a continuous-batching LLM inference engine and scheduling lab."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepserve.request import SamplingParams

__all__ = ["LLM", "LLMEngine", "SamplingParams"]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from stepserve.engine.llm import LLM
    from stepserve.engine.llm_engine import LLMEngine


def __getattr__(name: str):
    # The engine needs torch; import it only when asked, so the core stays torch-free.
    if name == "LLM":
        from stepserve.engine.llm import LLM

        return LLM
    if name == "LLMEngine":
        from stepserve.engine.llm_engine import LLMEngine

        return LLMEngine
    raise AttributeError(f"module 'stepserve' has no attribute {name!r}")
