"""One /metrics for the whole cluster: every replica's Prometheus text, each series
labelled with its replica (`engine`, vLLM's label for one engine of several) and `pool`,
grouped by metric family as the text format requires (HELP and TYPE once per family)."""

from __future__ import annotations

import re
from collections.abc import Sequence

_OWN_ENGINE = re.compile(r'(?<=[{,])engine="(?:[^"\\]|\\.)*",?')


def _families(text: str) -> list[tuple[str, list[str], list[str]]]:
    """(name, HELP/TYPE lines, sample lines) of each family, in order."""
    out: list[tuple[str, list[str], list[str]]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            name = parts[2] if len(parts) > 2 else ""
            if not out or out[-1][0] != name or out[-1][2]:
                out.append((name, [], []))
            out[-1][1].append(line)
        elif out:
            out[-1][2].append(line)
        else:
            out.append(("", [], [line]))
    return out


def with_labels(sample: str, labels: str) -> str:
    """`name{a="1"} 2` + `engine="0",pool="x"` -> `name{engine="0",pool="x",a="1"} 2`."""
    name_end = min((i for i in (sample.find("{"), sample.find(" ")) if i >= 0),
                   default=len(sample))
    name, rest = sample[:name_end], sample[name_end:]
    if rest.startswith("{"):  # the replica's own engine label: the merge's stands for it
        rest = _OWN_ENGINE.sub("", rest, count=1).replace("{,", "{").replace(",}", "}")
    if rest.startswith("{}"):
        rest = rest[2:]
    if rest.startswith("{"):
        return f"{name}{{{labels},{rest[1:]}"
    return f"{name}{{{labels}}}{rest}"


def merge_metrics(texts: Sequence[tuple[int, str, str]]) -> str:
    """texts: (engine index, pool, that replica's /metrics text)."""
    order: list[str] = []
    heads: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for engine, pool, text in texts:
        labels = f'engine="{engine}",pool="{_escape(pool)}"'
        for name, head, lines in _families(text):
            if name not in heads:
                order.append(name)
                heads[name] = head
                samples[name] = []
            samples[name] += [with_labels(s, labels) for s in lines]
    out = []
    for name in order:
        out += heads[name] + samples[name]
    return "\n".join(out) + "\n" if out else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
