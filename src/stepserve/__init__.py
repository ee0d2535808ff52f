"""stepserve: a continuous-batching LLM inference engine and scheduling lab."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["LLM", "LLMEngine", "SamplingParams"]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from stepserve.core.request import SamplingParams
    from stepserve.engine.llm import LLM
    from stepserve.engine.llm_engine import LLMEngine


def __getattr__(name: str):
    # Each loaded when asked: the package's top imports nothing, so every layer may
    # import it; the engine needs torch, and the core stays torch-free.
    if name == "SamplingParams":
        from stepserve.core.request import SamplingParams

        return SamplingParams
    if name == "LLM":
        from stepserve.engine.llm import LLM

        return LLM
    if name == "LLMEngine":
        from stepserve.engine.llm_engine import LLMEngine

        return LLMEngine
    raise AttributeError(f"module 'stepserve' has no attribute {name!r}")
