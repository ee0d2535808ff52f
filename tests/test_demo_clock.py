"""`stepserve demo` says where its time went, measured: a fresh cache is reported as
such (the model built first), the parts add up to no more than the total, and the JSON
carries the same numbers."""

from __future__ import annotations

import json

from stepserve.cli import main
from stepserve.demo.job import DemoOptions

SMALL = ["--model", "tiny", "--requests", "16", "--short", "1", "--long", "8",
         "--sim-requests", "128"]


def _run(tmp_path, capsys) -> tuple[str, dict]:
    out = tmp_path / f"demo-{len(list(tmp_path.iterdir()))}.json"
    assert main(["demo", *SMALL, "--json", str(out)]) == 0
    return capsys.readouterr().out, json.loads(out.read_text())


def test_fresh_then_cached_with_the_time_of_each_part(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STEPSERVE_CACHE", str(tmp_path / "cache"))  # empty: built first
    text, data = _run(tmp_path, capsys)
    timing = data["timing_s"]
    assert timing["fresh_cache"] is True
    assert "fresh cache: converted from the GGUF first" in text
    assert "(from a fresh cache)" in text.splitlines()[-2]
    parts = timing["model"] + timing["real_engine"] + timing["simulator"]
    assert 0 < parts <= timing["total"]
    assert all(timing[k] > 0 for k in ("model", "real_engine", "simulator"))
    text, data = _run(tmp_path, capsys)  # the same cache, now holding the model
    assert data["timing_s"]["fresh_cache"] is False and "(cached)" in text
    assert data["comparison"]["cpu_static_slot_utilization"] < 1


def test_the_cli_default_is_the_options_default(tmp_path, capsys, monkeypatch):
    import stepserve.cli.demo as cli_demo

    seen = {}
    monkeypatch.setattr(cli_demo, "run_demo", lambda options: seen.setdefault("o", options)
                        and 0)
    assert main(["demo"]) == 0
    assert seen["o"] == DemoOptions()
