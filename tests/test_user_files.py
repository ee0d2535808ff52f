"""The user's YAML files: aliases that would expand a short file into a huge value (a
"billion laughs") are refused before any value is built, and every message that quotes a
user's value quotes a short preview of it, whatever its size."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from stepserve.cli import main
from stepserve.config.errors import UsageError
from stepserve.config.user_files import MAX_ALIAS_VALUES, load_yaml
from stepserve.config.validate import PREVIEW_CHARS, preview

LAUGHS = "abcdefghi"


def laughs(fan_out: int = 10) -> str:
    """A flow list of nine anchored lists, each holding `fan_out` aliases of the one
    before: the last one stands for fan_out ** 9 values."""
    lists = [f"&a [{', '.join(['lol'] * fan_out)}]"]
    for prev, name in zip(LAUGHS, LAUGHS[1:]):
        lists.append(f"&{name} [{', '.join([f'*{prev}'] * fan_out)}]")
    return f"[{', '.join(lists)}]"


def _limit_memory() -> None:  # the old code grew without bound: fail, do not swap
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def _stepserve(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stepserve", *argv], capture_output=True,
                          text=True, timeout=120, preexec_fn=_limit_memory)


@pytest.mark.parametrize("command", [
    ("simulate", "--scenario", "quickstart", "--config", "{config}"),
    ("serve", "--config", "{config}"),
    ("simulate", "--workload", "{workload}"),
])
def test_an_alias_bomb_is_one_error_line_on_every_command(tmp_path, command):
    config = tmp_path / "config.yaml"
    config.write_text(f"max_num_seqs: {laughs()}\n")
    workload = tmp_path / "workload.yaml"
    workload.write_text(f"name: {laughs()}\narrival: {{poisson: {{rate: 1}}}}\n"
                        "num_requests: 1\nclasses: []\n")
    argv = [a.format(config=config, workload=workload) for a in command]
    done = _stepserve(*argv)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == "" and done.stderr.count("\n") == 1
    assert done.stderr.startswith("error: ")
    assert "aliases (*name) repeat 1,234,567,880 values" in done.stderr
    assert f"more than the {MAX_ALIAS_VALUES:,} allowed" in done.stderr


def test_a_value_holding_itself_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("scheduler:\n  max_num_seqs: &loop [1, *loop]\n")
    with pytest.raises(UsageError, match=r"the value at line 2, column 17 contains an "
                                         r"alias of itself"):
        load_yaml(path, "config file")


def test_ordinary_anchors_aliases_and_merge_keys_still_load(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("defaults: &d {prompt: {fixed: 8}, output: {fixed: 4}}\n"
                    "classes:\n  - {<<: *d, name: a}\n  - {<<: *d, name: b}\n"
                    "shared: &s [1, 2, 3]\nagain: [*s, *s]\n")
    data = load_yaml(path, "workload file")
    assert data["classes"][1] == {"prompt": {"fixed": 8}, "output": {"fixed": 4}, "name": "b"}
    assert data["again"] == [[1, 2, 3], [1, 2, 3]]


def test_aliases_up_to_the_limit_load(tmp_path):
    # 1 + 10 + 100 + ... values: four levels of ten aliases repeat 11,100 values
    path = tmp_path / "c.yaml"
    path.write_text("x: [&a [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], &b [" + ", ".join(["*a"] * 10)
                    + "], &c [" + ", ".join(["*b"] * 10) + "], &d ["
                    + ", ".join(["*c"] * 10) + "]]\n")
    assert len(load_yaml(path, "config file")["x"][3]) == 10


# ---- messages quote a preview of the value, never all of it ----

def _error(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    return err


def test_a_huge_config_value_is_quoted_by_its_first_characters(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(f"max_num_seqs: [{', '.join(map(str, range(5_000)))}]\n")
    err = _error(capsys, "simulate", "--scenario", "quickstart", "--config", str(path))
    assert "max_num_seqs = [0, 1, 2, 3, ...]: must be an integer" in err
    assert len(err) < 300


def test_a_huge_workload_value_is_quoted_by_its_first_characters(tmp_path, capsys):
    path = tmp_path / "w.yaml"
    # just under the alias limit: the file loads, the message must still be short
    aliases = ", ".join(["*a"] * (MAX_ALIAS_VALUES // 1001 - 1))
    path.write_text(f"name: x\nseed: [&a [{', '.join(['9'] * 1000)}], {aliases}]\n"
                    "arrival: {poisson: {rate: 1}}\nnum_requests: 1\n"
                    "classes: [{name: c, prompt: 8, output: 4}]\n")
    err = _error(capsys, "simulate", "--workload", str(path))
    assert "seed = [[9, 9, 9, 9, ...], [9, 9, 9, 9, ...], [9, 9, 9, 9, ...],...: must be " \
        "an integer" in err
    assert len(err) < 300


def test_a_huge_pools_value_is_quoted_by_its_first_characters(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    long_name = "p" * 100_000
    path.write_text(f"pools:\n  a: {{replicas: 1}}\nrouting: {{default: {long_name}}}\n")
    err = _error(capsys, "simulate", "--scenario", "quickstart", "--pools", str(path))
    assert f"routing.default = '{'p' * 27}...{'p' * 28}': not a pool (a)" in err


def test_preview_is_short_whatever_the_value():
    assert preview(12) == "12" and preview("abc") == "'abc'" and preview(None) == "None"
    assert preview({"a": list(range(100))}) == "{'a': [0, 1, 2, 3, ...]}"
    assert preview(10**3000) == "<an integer of 9,966 bits>"
    nested: list = []
    for _ in range(1000):
        nested = [nested] * 1000  # shared: a million-fold expansion per level
    assert len(preview(nested)) <= PREVIEW_CHARS
    assert len(preview("x" * 10**6)) <= PREVIEW_CHARS
    loop: list = [1]
    loop.append(loop)
    assert preview(loop) == "[1, [1, [1, [...]]]]"


def test_the_file_names_where_the_bomb_is(tmp_path):
    path = Path(tmp_path / "p.yaml")
    path.write_text(f"pools: {laughs(4)}\n")  # 4 ** 9: over the limit too
    with pytest.raises(UsageError, match=r"^pools file .*p\.yaml': its aliases"):
        load_yaml(path, "pools file")


@pytest.mark.parametrize(("rules", "message"), [
    ("[{pool: a, 1: x, b: y}]", "routing.rules[0]: conditions are prompt_tokens_over, "
     "max_tokens_over, priority_at_least, tenant, header; got ['b', 1]"),
    ("[{pool: a, tenant: 5}]", "routing.rules[0].tenant = 5: must be a tenant name or a "
     "list of them"),
    ("[{pool: a, tenant: [[1, 2]]}]", "routing.rules[0].tenant = [[1, 2]]: must be"),
    ("7", "routing.rules = 7: must be a list of rules"),
])
def test_a_malformed_pools_rule_is_a_message_not_a_traceback(tmp_path, rules, message):
    from stepserve.config.settings import EngineConfig
    from stepserve.routing.pools import load_pools_file

    path = tmp_path / "p.yaml"
    path.write_text(f"pools: {{a: {{replicas: 1}}}}\nrouting: {{rules: {rules}}}\n")
    with pytest.raises(UsageError) as e:
        load_pools_file(str(path), EngineConfig())
    assert message in str(e.value)
