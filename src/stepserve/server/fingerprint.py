"""The answers' `system_fingerprint`, as vLLM makes it: `stepserve-<version>-<hash8>`,
where the hash covers what can change an answer for the same request (the engine's
settings and the model's folder), so a client that logs it sees when the backend
changed. vLLM's `--fingerprint-mode`: `full` and `hash` give that string (a single
process has no parallelism to name), `custom` the literal `--fingerprint-value`, `none`
a null field."""

from __future__ import annotations

import hashlib

from stepserve import __version__

MODES = ("full", "hash", "custom", "none")


def system_fingerprint(settings: object, model_path: str, mode: str = "full",
                       value: str | None = None) -> str | None:
    """`settings`: the engine's config (its repr is hashed)."""
    if mode not in MODES:
        raise ValueError(f"fingerprint mode {mode!r}: must be one of {', '.join(MODES)}")
    if mode == "none":
        return None
    if mode == "custom":
        if not value:
            raise ValueError("fingerprint mode 'custom' needs a fingerprint value")
        return value
    digest = hashlib.sha256(f"{model_path}\n{settings!r}".encode()).hexdigest()
    return f"stepserve-{__version__}-{digest[:8]}"
