"""Drivers go through the engine core's seam: outside core/, nothing ends a request on,
or reads the queues or KV blocks of, a scheduler; they call `EngineCore.finish_request`
(and `abort_request`, a case of it) and read `EngineCore.snapshot()`.

The rule, checked on the syntax tree of every module outside core/:
* no chain `<x>.scheduler.<m>` where `m` is a scheduler's own member (its queues, its KV
  manager, ending requests, its counters) rather than a setting of the config's
  `scheduler` section (`config.scheduler.max_model_len` stays fine);
* the same through a name bound to `<x>.scheduler` (`sched = core.scheduler;
  sched.running`);
* every `.finish_request(...)` call is made on an engine core (`<x>.core` or `core`).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[1] / "src" / "stepserve"

# what a scheduler has and its settings section does not
SCHEDULER_MEMBERS = frozenset({
    "finish_request", "abort_request", "fail_step", "running", "waiting", "swapped", "kv",
    "requests", "finished", "take_finished", "check_integrity", "num_preemptions_total",
    "schedule", "update_from_output", "add_request", "has_unfinished", "step_records",
})
CORE_NAMES = frozenset({"core"})


def violations(source: str, where: str = "<source>") -> list[str]:
    tree = ast.parse(source)
    aliases = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
               and isinstance(node.value, ast.Attribute) and node.value.attr == "scheduler"
               for target in node.targets if isinstance(target, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in SCHEDULER_MEMBERS:
            base = node.value
            if (isinstance(base, ast.Attribute) and base.attr == "scheduler") or \
                    (isinstance(base, ast.Name) and base.id in aliases):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)} reaches past the "
                             f"engine core (use EngineCore.finish_request / snapshot())")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "finish_request":
            receiver = node.func.value
            name = receiver.attr if isinstance(receiver, ast.Attribute) else \
                receiver.id if isinstance(receiver, ast.Name) else ""
            if name not in CORE_NAMES:
                found.append(f"{where}:{node.lineno}: {ast.unparse(node.func)}(...) ends a "
                             f"request outside EngineCore.finish_request")
    return found


def test_no_driver_reaches_past_the_engine_core():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.parts[0] == "core":
            continue
        found += violations(path.read_text(), str(rel))
    assert not found, "\n".join(found)


def test_the_rule_sees_each_way_past_the_seam():
    bad = {
        "engine.scheduler.finish_request('r', status)": "ends a request",
        "self.engine.scheduler.kv.check_integrity()": "reaches past",
        "n = len(rep.core.scheduler.running)": "reaches past",
        "sched = self.core.scheduler\nn = len(sched.waiting) + len(sched.swapped)":
            "reaches past",
        "watch(engine.scheduler.kv)": "reaches past",
        "self.scheduler.finish_request('r', status)": "ends a request",
    }
    for source, what in bad.items():
        assert any(what in v for v in violations(source)), source
    fine = ("n = config.scheduler.max_model_len", "sc = given.scheduler\nsc.max_num_seqs",
            "self.engine.core.finish_request('r', status)",
            "self.core.finish_request('r', status)", "engine.core.snapshot().num_running")
    for source in fine:
        assert violations(source) == [], source
