"""benchmarks/contention.py: its competing loads start at the priority they name, write
and remove their files, and leave no process behind however the run ends; the table's
ratios on made-up results; a mistaken flag is one line and exit 2; and, slow, the whole
path on the tiny model against a stand-in llama-server."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import contention  # noqa: E402
import contention_loads as loads  # noqa: E402
from contention_table import Run, format_tables  # noqa: E402

WAIT_S = 60.0  # an upper bound on waiting for a child's event, not a timing claim


def stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name (which may hold spaces): state first."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()


def nice_of(pid: int) -> int:
    return int(stat_fields(pid)[16])


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group `pgid`."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = stat_fields(int(entry.name))
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def wait_for(what: str, ready) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ready():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


def assert_all_gone(pids: list[int]) -> None:
    """The load's own children reaped, and nothing alive in their groups (a grandchild is
    killed with its group but reaped by whoever inherits it, so it may linger as a zombie
    a moment)."""
    assert pids
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        wait_for(f"group {pid} empty", lambda pid=pid: group_members(pid) == [])


@pytest.mark.parametrize(("niceness", "expected"), [
    (None, os.getpriority(os.PRIO_PROCESS, 0)), (19, 19)])
def test_the_busy_loop_runs_at_the_priority_it_names(niceness, expected):
    with loads.busy_loop(niceness) as started:
        (pid,) = started.pids
        assert nice_of(pid) == expected
        assert int(stat_fields(pid)[2]) == pid  # a group of its own, killed as one
    assert_all_gone([pid])


@pytest.mark.parametrize("own_session", [True, False])
def test_the_niced_loop_runs_in_its_own_session_or_in_ours(own_session):
    # autogroups make nice count only inside a session: both cases are measured
    with loads.busy_loop(19, own_session=own_session) as started:
        (pid,) = started.pids
        fields = stat_fields(pid)
        assert int(fields[2]) == pid  # a group of its own either way, killed as one
        assert (int(fields[3]) == pid) is own_session
        assert (int(fields[3]) == os.getsid(0)) is not own_session
    assert_all_gone([pid])


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_no_load_outlives_a_body_that_raises(error):
    with pytest.raises(error):  # noqa: PT012 (the raise is the point)
        with loads.busy_loop(19) as started:
            pids = started.pids
            raise error("the run failed")
    assert_all_gone(pids)


def test_what_a_load_starts_dies_with_it():
    """A child's own children (a build's compiler processes) are in its group and go too."""
    cmd = ["sh", "-c", "sleep 600 & wait"]
    with loads._children([cmd]) as started:
        (pid,) = started.pids
        wait_for("sh started sleep", lambda: len(group_members(pid)) == 2)
        (grandchild,) = set(group_members(pid)) - {pid}
    assert_all_gone([pid])
    assert grandchild not in group_members(pid)


def test_the_compile_load_writes_fsynced_files_and_removes_them(tmp_path):
    with loads.compile_like(burst_ms=(1, 2), write_mb=1, scratch_root=str(tmp_path)) as started:
        assert len(started.pids) == loads.COMPILE_JOBS
        assert started.scratch is not None and started.scratch.parent == tmp_path
        assert all(nice_of(p) == os.getpriority(os.PRIO_PROCESS, 0) for p in started.pids)
        scratch = started.scratch

        def every_job_wrote_a_file() -> bool:
            written = {p.name.split("-")[0] for p in scratch.iterdir()
                       if p.stat().st_size == 1 << 20}
            return written == {f"job{j}" for j in range(loads.COMPILE_JOBS)}

        wait_for("each job wrote a whole file", every_job_wrote_a_file)
        # each job rotates over a few names: the folder stays bounded
        wait_for("a job came back to its first file", lambda: len(list(scratch.iterdir()))
                 == loads.COMPILE_JOBS * loads.COMPILE_FILES_PER_JOB)
        assert started.exited() == []
        pids = started.pids
    assert list(tmp_path.iterdir()) == []
    assert_all_gone(pids)


def test_quiet_starts_nothing():
    with loads.quiet() as started:
        assert started.pids == [] and started.exited() == []
    assert [c.name for c in loads.conditions()][0] == "quiet"


def fake_run(server: str, condition: str, tok_s: float, ttft_p99: float | None,
             concurrency: int = 8) -> Run:
    summary = {"throughput_tokens_per_s": tok_s, "ttft_p50_s": 0.1, "ttft_p99_s": ttft_p99,
               "tpot_p50_s": 0.02, "tpot_p99_s": 0.04}
    return Run(server, condition, concurrency, 1, "load average: 0.00", [0.0] * 3, summary,
               1.0)


def rows(table: str) -> list[list[str]]:
    return [line.split() for line in table.splitlines()]


def test_the_table_gives_ratios_to_quiet_and_between_the_servers():
    runs = [fake_run("stepserve", "quiet", 200.0, 1.0), fake_run("stepserve", "busy", 100.0, 3.0),
            fake_run("llama.cpp", "quiet", 100.0, 2.0), fake_run("llama.cpp", "busy", 80.0, None)]
    table = format_tables(runs)
    lines = rows(table)
    assert lines[0] == ["c=8"]
    assert lines[3] == ["quiet", "stepserve", "200.0", "100.0", "1000.0", "20.0", "40.0"]
    assert lines[4] == ["llama.cpp", "100.0", "100.0", "2000.0", "20.0", "40.0"]
    assert lines[5] == ["stepserve/llama", "2.00x", "1.00x", "0.50x", "1.00x", "1.00x"]
    assert lines[6] == ["busy", "stepserve", "100.0", "100.0", "3000.0", "20.0", "40.0"]
    assert lines[7] == ["vs", "quiet", "0.50x", "1.00x", "3.00x", "1.00x", "1.00x"]
    assert lines[8] == ["llama.cpp", "80.0", "100.0", "-", "20.0", "40.0"]
    assert lines[9] == ["vs", "quiet", "0.80x", "1.00x", "-", "1.00x", "1.00x"]
    assert lines[10] == ["stepserve/llama", "1.25x", "1.00x", "-", "1.00x", "1.00x"]
    assert "vs quiet" not in "\n".join(table.splitlines()[3:6])  # quiet against itself


def test_one_table_per_concurrency_and_no_quiet_run_gives_no_ratio():
    runs = [fake_run("stepserve", "busy", 100.0, 1.0, concurrency=c) for c in (1, 8)]
    table = format_tables(runs)
    assert [line for line in table.splitlines() if line.startswith("c=")] == ["c=1", "c=8"]
    vs_quiet = [r for r in rows(table) if r[:2] == ["vs", "quiet"]]
    assert len(vs_quiet) == 2 and all(set(r[2:]) == {"-"} for r in vs_quiet)
    assert "stepserve/llama" not in table  # neither a row nor the note's word for it


@pytest.mark.parametrize(("argv", "says"), [
    (["--concurrency", "0"], "--concurrency = 0"),
    (["--concurrency", "8,x"], "comma-separated integers"),
    (["--num-prompts", "0"], "--num-prompts = 0"),
    (["--lead", "-1"], "--lead = -1"),
    (["--conditions", "quiet,loud"], "no condition 'loud'"),
    (["--conditions", "quiet,quiet"], "named twice"),
    (["--llama-server", "/no/such/llama-server"], "not an executable file"),
    (["--scratch-dir", "/no/such/folder"], "not a folder"),
    (["--json", "/no/such/folder/out.json"], "does not exist"),
    (["--bogus"], "unrecognized arguments"),
])
def test_a_mistaken_flag_is_one_line_and_exit_2(argv, says, capsys):
    try:
        code = contention.main(argv)
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "error:" in err and says in err, err


def test_quick_with_llama_server_needs_a_gguf(tmp_path, capsys):
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    assert contention.main(["--quick", "--llama-server", str(binary)]) == 2
    assert "pass --gguf" in capsys.readouterr().err


def test_the_script_refuses_a_flag_without_a_traceback():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "contention.py"), "--input-len",
                           "0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --input-len = 0: must be an integer in [1, 1048576]"]


@pytest.mark.slow
def test_quick_runs_both_servers_under_each_condition(tmp_path):
    """The whole path on the tiny model; llama-server's place taken by a stand-in that
    serves the tiny model through `stepserve serve` (the real binary is not built here)."""
    fake = tmp_path / "llama-server"
    fake.write_text(f"""#!{sys.executable}
import sys
argv = sys.argv[1:]
port = argv[argv.index("--port") + 1]
assert "--parallel" in argv and "--ctx-size" in argv and "-m" in argv
sys.argv = ["stepserve", "serve", "--model", "tiny", "--port", port, "--num-gpu-blocks",
            "512", "--max-model-len", "256", "--log-level", "warning"]
from stepserve.cli import main
sys.exit(main())
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "contention.py"), "--quick", "--llama-server",
         str(fake), "--gguf", str(tmp_path / "unused.gguf"), "--conditions",
         "quiet,busy-nice19", "--port", "18133", "--lead", "0", "--json", str(out)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert [(r["server"], r["condition"], r["seed"]) for r in result["runs"]] == [
        (s, c, seed) for s in ("stepserve", "llama.cpp")
        for seed, c in enumerate(("quiet", "busy-nice19"), start=1)]
    assert all(r["summary"]["throughput_tokens_per_s"] > 0 for r in result["runs"])
    assert all("load average" in r["uptime_before"] for r in result["runs"])
    assert set(result["servers"]) == {"stepserve", "llama.cpp"}
    assert [c["name"] for c in result["conditions"]] == ["quiet", "busy-nice19"]
    assert "vs quiet" in done.stdout and "stepserve/llama" in done.stdout
