"""Result files are written whole or not at all, and every output asked for is tried: a
write that fails (a full disk) leaves the file that was there before as it was, the other
outputs are still written, and the command ends with one `error:` line naming the file
that was not written, exit 2."""

from __future__ import annotations

import errno
import json
import os

import pytest
import yaml

from stepserve.cli import main
from stepserve.config import user_files
from stepserve.config.user_files import OutputFile, write_atomic, write_outputs

EARLIER = '{"an earlier result": "kept"}\n'


def full_disk_on_call(monkeypatch, failing: set[int]) -> list[int]:
    """Writes numbered from 0 in `failing` write a few bytes, then fail as a full disk
    does; the list returned counts the writes."""
    real = user_files._write_all
    calls: list[int] = []

    def write_all(fd: int, data: bytes) -> None:
        calls.append(len(calls))
        if calls[-1] in failing:
            os.write(fd, data[:5])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)

    monkeypatch.setattr(user_files, "_write_all", write_all)
    return calls


def test_a_failed_write_keeps_the_earlier_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    path.write_text(EARLIER)
    full_disk_on_call(monkeypatch, {0})
    with pytest.raises(OSError) as e:
        write_atomic(path, json.dumps({"new": list(range(10_000))}))
    assert e.value.errno == errno.ENOSPC
    assert path.read_text() == EARLIER
    assert os.listdir(tmp_path) == ["r.json"]


def test_a_written_file_replaces_the_earlier_one_and_keeps_its_mode(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(EARLIER)
    path.chmod(0o640)
    write_atomic(path, "new\n")
    assert path.read_text() == "new\n" and (path.stat().st_mode & 0o777) == 0o640
    assert os.listdir(tmp_path) == ["r.json"]


def test_a_link_is_written_through(tmp_path):
    target = tmp_path / "real.json"
    target.write_text(EARLIER)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_atomic(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"


def test_every_output_is_tried_and_each_failure_named(tmp_path, monkeypatch, capsys):
    a, b, c = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "c.txt"
    full_disk_on_call(monkeypatch, {0, 2})
    failed = write_outputs([OutputFile.text("--a", a, lambda: "A"),
                            OutputFile.text("--b", b, lambda: "B"),
                            OutputFile.text("--none", None, lambda: "never"),
                            OutputFile.text("--c", c, lambda: "C")])
    assert failed is not None
    assert f"--a {str(a)!r} not written (No space left on device)" in failed
    assert f"--c {str(c)!r} not written (No space left on device)" in failed
    assert "--b" not in failed and b.read_text() == "B"
    assert not a.exists() and not c.exists()
    assert capsys.readouterr().out == f"wrote {b}\n"


# ---- the commands ----

def test_bench_writes_the_other_outputs_when_its_json_fails(tmp_path, monkeypatch, capsys):
    out = {name: tmp_path / name for name in ("r.json", "r.csv", "r.md", "vllm.json")}
    out["r.json"].write_text(EARLIER)
    full_disk_on_call(monkeypatch, {0})  # --json is written first
    rc = main(["bench", "--sim", "--cost", "constant", "--random-input-len", "4",
               "--random-output-len", "4", "--num-prompts", "4", "--no-progress",
               "--json", str(out["r.json"]), "--csv", str(out["r.csv"]),
               "--markdown", str(out["r.md"]), "--save-result",
               "--result-filename", str(out["vllm.json"])])
    captured = capsys.readouterr()
    assert rc == 2
    assert out["r.json"].read_text() == EARLIER  # the earlier result, whole
    assert out["r.csv"].read_text().startswith("index,request_class,")
    assert "## " in out["r.md"].read_text()
    assert json.loads(out["vllm.json"].read_text())["completed"] == 4
    for name in ("r.csv", "r.md", "vllm.json"):
        assert f"wrote {out[name]}" in captured.out
    (line,) = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: --json {str(out['r.json'])!r} not written (No space "
                           "left on device)")
    assert sorted(os.listdir(tmp_path)) == ["r.csv", "r.json", "r.md", "vllm.json"]


def test_simulate_keeps_the_earlier_result_when_its_json_fails(tmp_path, monkeypatch,
                                                                capsys):
    workload = tmp_path / "w.yaml"
    workload.write_text(yaml.safe_dump({
        "name": "w", "num_requests": 5, "arrival": {"poisson": {"rate": 5.0}},
        "classes": [{"name": "a", "prompt": 8, "output": 4}]}))
    result = tmp_path / "r.json"
    result.write_text(EARLIER)
    full_disk_on_call(monkeypatch, {0})
    rc = main(["simulate", "--workload", str(workload), "--cost", "constant",
               "--no-progress", "--json", str(result)])
    assert rc == 2 and result.read_text() == EARLIER
    err = capsys.readouterr().err
    assert err.startswith(f"error: --json {str(result)!r} not written") and \
        err.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == ["r.json", "w.yaml"]


def test_sweep_writes_its_report_when_its_json_fails(tmp_path, monkeypatch, capsys):
    result, report = tmp_path / "s.json", tmp_path / "report"
    result.write_text(EARLIER)
    full_disk_on_call(monkeypatch, {0})
    rc = main(["sweep", "--scenario", "quickstart", "--scenario-runs", "A", "--vary",
               "rate=4,12", "--requests", "40", "--quiet", "--json", str(result),
               "--report", str(report)])
    captured = capsys.readouterr()
    assert rc == 2 and result.read_text() == EARLIER
    assert "<h2>Knee</h2>" in (report / "index.html").read_text()
    assert f"wrote {report / 'index.html'}" in captured.out
    (line,) = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: --json {str(result)!r} not written")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write in any folder")
def test_a_file_in_a_folder_that_cannot_be_written_is_refused_before_the_work(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "r.json").write_text(EARLIER)
    folder.chmod(0o555)  # the file can be written, but nothing created beside it
    try:
        with pytest.raises(user_files.UsageError, match="no permission to create files in"):
            user_files.check_output_file("--json", folder / "r.json")
    finally:
        folder.chmod(0o755)
