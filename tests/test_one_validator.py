"""One validator decides whether a user's number, range or choice is allowed, and one
message shape refuses it: `name = value: must be <what is allowed>`. Each layer raises
its own error type (ConfigError, WorkloadError, ValueError, UsageError) with that text.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest

from stepserve.config.errors import UsageError
from stepserve.config.limits import Range, check_flags
from stepserve.config.settings import CacheConfig, ConfigError, SchedulerConfig
from stepserve.config.validate import Allowed, refusal
from stepserve.core.request import SamplingParams
from stepserve.workload.errors import WorkloadError, check_int, check_positive, check_range

SRC = Path(__file__).resolve().parents[1] / "src" / "stepserve"


@pytest.mark.parametrize("allowed, value, message", [
    (Allowed(1, 65536), 0, "max_num_seqs = 0: must be an integer in [1, 65536]"),
    (Allowed(1, 65536), 2.0, "max_num_seqs = 2.0: must be an integer in [1, 65536]"),
    (Allowed(1, 65536), True, "max_num_seqs = True: must be an integer in [1, 65536]"),
    (Allowed(1, 65536), "8", "max_num_seqs = '8': must be an integer in [1, 65536]"),
    (Allowed(None, 10), 10**400, "max_num_seqs = <an integer of 1,329 bits>: must be an "
                                 "integer <= 10"),
    (Allowed(0.0, 0.5, float), 0.9, "max_num_seqs = 0.9: must be a finite number in [0, 0.5]"),
    (Allowed(0.0, 0.5, float), math.nan, "max_num_seqs = nan: must be a finite number in "
                                         "[0, 0.5]"),
    (Allowed(0.0, 0.5, float), math.inf, "max_num_seqs = inf: must be a finite number in "
                                         "[0, 0.5]"),
    (Allowed(1e-6, 1e6, float, inf_ok=True), -math.inf,
     "max_num_seqs = -inf: must be a finite number in [1e-06, 1000000] (or inf)"),
    (Allowed(0, None, float, lo_open=True), -5.0, "max_num_seqs = -5: must be a finite number > 0"),
    (Allowed(0, 1, float, lo_open=True), 0, "max_num_seqs = 0: must be a finite number in (0, 1]"),
    (Allowed(0, 10, hi_open=True), 10, "max_num_seqs = 10: must be an integer in [0, 10)"),
    (Allowed(None, 10), 11, "max_num_seqs = 11: must be an integer <= 10"),
    (Allowed(kind=bool), 1, "max_num_seqs = 1: must be true or false"),
    (Allowed(kind=str, choices=("fcfs", "srpt")), "lifo",
     "max_num_seqs = 'lifo': must be one of fcfs, srpt"),
    (Allowed(1, 4, optional=True), 5, "max_num_seqs = 5: must be an integer in [1, 4] (or null)"),
    (Allowed(0, 8, note=" (0: off)"), -1, "max_num_seqs = -1: must be an integer in [0, 8] "
                                          "(0: off)"),
])
def test_every_refusal_names_the_value_and_what_is_allowed(allowed, value, message):
    assert allowed.problem("max_num_seqs", value) == message
    assert refusal("max_num_seqs", value, allowed) == message
    with pytest.raises(UsageError) as e:
        allowed.check("max_num_seqs", value)
    assert str(e.value) == message


@pytest.mark.parametrize("allowed, value, checked", [
    (Allowed(1, 4), 4, 4),
    (Allowed(0.0, 1.0, float), 1, 1.0),  # an int is a number, returned as float
    (Allowed(1e-6, 1e6, float, inf_ok=True), math.inf, math.inf),
    (Allowed(1, 4, optional=True), None, None),
    (Allowed(kind=str, choices=("a", "b")), "b", "b"),
    (Allowed(kind=bool), False, False),
])
def test_an_allowed_value_comes_back_checked(allowed, value, checked):
    assert allowed.problem("x", value) is None
    result = allowed.check("x", value)
    assert result == checked and type(result) is type(checked)


def test_each_layer_raises_its_own_error_type_with_the_same_message():
    with pytest.raises(ConfigError, match=r"^scheduler\.max_num_seqs = 0: must be an integer "
                                          r"in \[1, 65536\]$"):
        SchedulerConfig(max_num_seqs=0)
    with pytest.raises(ConfigError, match=r"^cache\.watermark = 0\.9: must be a finite "
                                          r"number in \[0, 0\.5\]$"):
        CacheConfig(watermark=0.9)
    with pytest.raises(WorkloadError, match=r"^n = 0: must be an integer in \[1, 10\]$"):
        check_int("n", 0, 1, 10)
    with pytest.raises(WorkloadError, match=r"^share = 0: must be a finite number > 0$"):
        check_positive("share", 0)
    with pytest.raises(WorkloadError, match=r"^rate = True: must be a finite number in "):
        check_range("rate", True, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"^top_p = 0: must be a finite number in \(0, 1\]$"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match=r"top_k = 1.5: must be an integer in \[0, 1048576\] "
                                         r"\(0 or -1: off\)"):
        SamplingParams(top_k=1.5)

    class Flags:
        max_num_seqs = 0

    with pytest.raises(UsageError, match=r"^--max-num-seqs = 0: must be an integer in "
                                         r"\[1, 8\]$"):
        check_flags(Flags(), {"max_num_seqs": Range(1, 8)})


# A range message formatted anywhere but config/validate.py: "must be in [",
# "a number in (", "must be between", or a bound interpolated into an interval
# ("in [{lo}"). Every such message is a range check of its own, with its own wording.
RANGE_MESSAGE = re.compile(r"(?:must be|\ban? [a-z]+(?: [a-z]+)?) (?:in|between) [\[(]"
                           r"|\bin [\[(]\{")

# Modules that still word a range of their own (each a one-off bound of its module, not
# a general checker): this list may only shrink, and each entry must still match, so a
# module moved onto the validator leaves the list with it.
NOT_YET_ON_THE_VALIDATOR = {
    "bench/workload_options.py", "bench/results.py", "metrics/percentiles.py",
    "server/api.py", "sweep/window.py",
}


def _message_texts(source: str) -> list[str]:
    """The string literals of a module, docstrings left out; an f-string as one text
    (its parts joined, each replacement field written `{`)."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    texts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            texts.append("".join(part.value if isinstance(part, ast.Constant) else "{"
                                 for part in node.values))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings:
            texts.append(node.value)
    return texts


def _modules_wording_ranges() -> set[str]:
    found = set()
    for path in SRC.rglob("*.py"):
        name = path.relative_to(SRC).as_posix()
        if name != "config/validate.py" and any(
                RANGE_MESSAGE.search(text) for text in _message_texts(path.read_text())):
            found.add(name)
    return found


def test_only_the_validator_words_a_range():
    found = _modules_wording_ranges()
    assert found - NOT_YET_ON_THE_VALIDATOR == set(), (
        "these modules format a range message themselves; check the value with "
        "stepserve.config.validate.Allowed instead")
    assert NOT_YET_ON_THE_VALIDATOR - found == set(), "moved onto the validator: drop them"
