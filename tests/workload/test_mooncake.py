"""Mooncake traces: the reader's refusals (each naming the line and what is allowed), the
arrivals (from the first timestamp, slowed), and prompt token ids that follow the hash
ids: equal hash-id prefixes give equal token prefixes, the last block cut."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepserve.workload.errors import WorkloadError
from stepserve.workload.loader import TraceOptions, trace_workload
from stepserve.workload.trace import is_mooncake_trace, load_mooncake_trace, trace_token_ids

SAMPLE = Path(__file__).parents[2] / "benchmarks" / "workloads" / "mooncake_sample.jsonl"


def _line(**over) -> dict:
    return {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2],
            **over}


def _write(tmp_path: Path, *records, raw: str = "") -> Path:
    p = tmp_path / "trace.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in records) + raw)
    return p


def test_a_trace_becomes_specs_arriving_from_its_first_timestamp(tmp_path):
    p = _write(tmp_path, _line(timestamp=5000), _line(timestamp=7500, output_length=9))
    trace = load_mooncake_trace(p, slowdown=2.0)
    assert [s.arrival_s for s in trace.specs] == [0.0, 5.0]
    second = trace.specs[1]
    assert (second.prompt_len, second.output_len, second.max_tokens) == (1000, 9, 9)
    assert second.hash_ids == (1, 2) and second.block_tokens == 512
    assert trace.note == ""


def test_an_out_of_order_trace_is_sorted_with_a_note(tmp_path):
    p = _write(tmp_path, _line(timestamp=3000, hash_ids=[7]), _line(timestamp=1000))
    trace = load_mooncake_trace(p)
    assert [s.hash_ids for s in trace.specs] == [(1, 2), (7,)]
    assert [s.index for s in trace.specs] == [0, 1]
    assert "out of order" in trace.note


@pytest.mark.parametrize("raw, message", [
    ('{"timestamp": 0,\n', "line 2: not valid JSON"),
    ("[1, 2]\n", "line 2: [1, 2]: must be a JSON object"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 5}\n',
     "line 2: missing required key 'hash_ids'"),
    (json.dumps(_line(input_length=-3)) + "\n",
     "line 2: input_length = -3: must be an integer in [1, 1048576]"),
    (json.dumps(_line(output_length=0)) + "\n", "line 2: output_length = 0"),
    (json.dumps(_line(input_length=1.5)) + "\n", "line 2: input_length = 1.5"),
    (json.dumps(_line(timestamp=-1)) + "\n", "line 2: timestamp = -1"),
    (json.dumps(_line(hash_ids=[1, 2, 3])) + "\n",
     "line 2: hash_ids = [1, 2, 3]: 3 ids; at most 2 (input_length 1000 in blocks of 512"),
    (json.dumps(_line(hash_ids="12")) + "\n", "line 2: hash_ids = '12': must be a list"),
    (json.dumps(_line(hash_ids=[1, -1])) + "\n", "line 2: hash_ids[1] = -1"),
    (json.dumps(_line(hash_ids=[1, 2**70])) + "\n", "line 2: hash_ids[1] = 1180591620717"),
    ('{"timestamp": 1e999, "input_length": 5, "output_length": 5, "hash_ids": []}\n',
     "line 2: timestamp = inf"),
    ('{"timestamp": 0, "input_length": 1' + "0" * 5000 + ', "output_length": 5, '
     '"hash_ids": []}\n', "line 2: not valid JSON (ValueError"),
    ('{"timestamp": 0, "input_length": 1' + "0" * 400 + ', "output_length": 5, '
     '"hash_ids": []}\n', "line 2: input_length = <an integer of"),
])
def test_a_bad_line_is_refused_naming_the_line_and_what_is_allowed(tmp_path, raw, message):
    p = _write(tmp_path, _line(), raw=raw)
    with pytest.raises(WorkloadError) as e:
        load_mooncake_trace(p)
    assert f"Mooncake trace {str(p)!r} " in str(e.value)
    assert message in str(e.value)


def test_an_empty_or_missing_trace_and_bad_options_are_refused(tmp_path):
    with pytest.raises(WorkloadError, match="holds no requests"):
        load_mooncake_trace(_write(tmp_path, raw="\n\n"))
    with pytest.raises(WorkloadError, match="no such file"):
        load_mooncake_trace(tmp_path / "none.jsonl")
    p = _write(tmp_path, _line())
    with pytest.raises(WorkloadError,
                       match=r"--trace-slowdown = 0(\.0)?: must be a finite number in \(0, "):
        load_mooncake_trace(p, slowdown=0.0)
    with pytest.raises(WorkloadError, match="--trace-block-tokens = 0"):
        load_mooncake_trace(p, block_tokens=0)


def test_equal_hash_id_prefixes_give_equal_token_prefixes_and_the_last_block_is_cut(tmp_path):
    p = _write(tmp_path, _line(hash_ids=[1, 2]), _line(input_length=700, hash_ids=[1, 3]),
               _line(input_length=600, hash_ids=[1, 2]), _line(input_length=600, hash_ids=[4]))
    a, b, c, d = (trace_token_ids(s) for s in load_mooncake_trace(p).specs)
    assert (len(a), len(b), len(c), len(d)) == (1000, 700, 600, 600)
    assert a[:512] == b[:512] and a[512:600] != b[512:600]  # shared block 1, then apart
    assert c == a[:600]  # the same hash ids, a shorter cut
    assert d[:512] != a[:512]


def test_token_ids_are_deterministic_and_in_the_vocabulary(tmp_path):
    p = _write(tmp_path, _line(), _line(hash_ids=[1]))
    first = [trace_token_ids(s, vocab=300) for s in load_mooncake_trace(p).specs]
    again = [trace_token_ids(s, vocab=300) for s in load_mooncake_trace(p).specs]
    assert first == again
    assert all(10 <= t < 300 for ids in first for t in ids)
    # past its one hash id the second prompt is its own: it shares only the first block
    assert first[0][:512] == first[1][:512] and first[0][512:] != first[1][512:]


def test_a_smaller_trace_block_scales_the_hash_ids(tmp_path):
    p = _write(tmp_path, _line(input_length=40, hash_ids=[1, 2, 3]),
               _line(input_length=40, hash_ids=[1, 2, 9]))
    a, b = (trace_token_ids(s) for s in load_mooncake_trace(p, block_tokens=16).specs)
    assert a[:32] == b[:32] and a[32:] != b[32:]


def test_the_format_is_told_by_the_first_line_and_both_formats_replay(tmp_path):
    ours = tmp_path / "ours.jsonl"
    ours.write_text('{"arrival_s": 1.0, "prompt_len": 10, "output_len": 2}\n')
    assert is_mooncake_trace(SAMPLE) and not is_mooncake_trace(ours)
    assert not is_mooncake_trace(tmp_path / "none.jsonl")
    slowed = trace_workload(TraceOptions(str(ours), slowdown=3.0)).generate()
    assert slowed[0].arrival_s == 3.0
    sample = trace_workload(TraceOptions(str(SAMPLE))).generate()
    assert len(sample) == 200 and sample[0].arrival_s == 0.0
    with pytest.raises(WorkloadError, match="line 1: unknown key 'timestamp'"):
        trace_workload(TraceOptions(str(SAMPLE), format="stepserve"))
    with pytest.raises(WorkloadError, match="--trace-block-tokens 16: goes with a Mooncake"):
        trace_workload(TraceOptions(str(ours), block_tokens=16))
