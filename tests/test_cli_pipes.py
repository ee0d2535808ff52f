"""A reader that closes the pipe early (`stepserve ... | head -1`) ends the output
quietly: no BrokenPipeError traceback, a status of 0 (or 141, as a command killed by
SIGPIPE), and the files the command writes after printing still written."""

import json
import subprocess
import sys

import pytest

COMMANDS = [
    ["simulate", "--scenario", "quickstart", "--requests", "30", "--runs", "A"],
    ["plan", "speedup", "--group", "20x2000", "--group", "108x20", "--concurrency", "64"],
    ["plan", "models"],
    ["sweep", "--help"],
]


def _closed_reader(argv: list[str]) -> subprocess.CompletedProcess:
    """Run `stepserve argv` with its stdout a pipe whose reader is gone before it writes."""
    proc = subprocess.Popen([sys.executable, "-m", "stepserve", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the only reader: every write now finds the pipe closed
    err = proc.stderr.read().decode()
    proc.stderr.close()
    return subprocess.CompletedProcess(argv, proc.wait(), "", err)


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_closed_pipe_ends_quietly(argv):
    done = _closed_reader(argv)
    assert done.returncode in (0, 141), done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_files_are_still_written_after_the_reader_left(tmp_path):
    out = tmp_path / "sim.json"
    done = _closed_reader(["simulate", "--scenario", "quickstart", "--requests", "30",
                           "--runs", "A", "--json", str(out)])
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["runs"][0]["name"] == "A"
