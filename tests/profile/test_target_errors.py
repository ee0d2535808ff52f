"""What `profile --target` refuses: each a one-line error and exit status 2, never a
traceback."""

from __future__ import annotations

import socket

import pytest
from stub_server import stub_server

from stepserve.cli import main


def run(capsys, *flags: str) -> tuple[int, str]:
    rc = main(["profile", *flags])
    err = capsys.readouterr().err.strip()
    return rc, err


def one_line_error(capsys, *flags: str) -> str:
    rc, err = run(capsys, *flags)
    assert rc == 2, err
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nobody listens


def test_unreachable_url(capsys, tmp_path):
    err = one_line_error(capsys, "--target", f"http://127.0.0.1:{closed_port()}",
                         "--out", str(tmp_path / "p.json"))
    assert "cannot reach" in err and not (tmp_path / "p.json").exists()


def test_not_a_url(capsys):
    assert "http://" in one_line_error(capsys, "--target", "localhost:8000")


@pytest.mark.parametrize("budget", ["1", "0", "-5", "1e9"])
def test_budget_out_of_range(capsys, budget):
    assert "--budget-s" in one_line_error(capsys, "--target", "http://127.0.0.1:1",
                                          "--budget-s", budget)


def test_a_401_names_the_api_key_flag(capsys, tmp_path):
    with stub_server(api_key="secret") as url:
        err = one_line_error(capsys, "--target", url, "--out", str(tmp_path / "p.json"))
        assert "401" in err and "--api-key" in err
        err = one_line_error(capsys, "--target", url, "--api-key", "wrong",
                             "--out", str(tmp_path / "p.json"))
        assert "401" in err


def test_a_server_without_metrics_is_profiled(capsys, tmp_path):
    out = tmp_path / "p.json"
    with stub_server(slots=2) as url:
        rc, err = run(capsys, "--target", url, "--budget-s", "30", "--out", str(out))
    assert rc == 0, err
    assert out.exists()


def test_refit_of_a_file_that_is_no_profile(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "stepserve.cost/1", "coefficients": {}}')
    assert "not a target profile" in one_line_error(capsys, "--refit", str(bad))
    bad.write_text("[1, 2")
    assert "JSON" in one_line_error(capsys, "--refit", str(bad))


def test_target_and_refit_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as e:  # argparse's own one line
        main(["profile", "--target", "http://127.0.0.1:1", "--refit", "x.json"])
    assert e.value.code == 2
    assert "not allowed with" in capsys.readouterr().err
