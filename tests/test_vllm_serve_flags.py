"""Every flag of `vllm serve` (vLLM 0.32, its own `--help=all` captured in the fixture)
on `stepserve serve`: the table holds each of them, each kind does what it says (a
warning line, a one-line refusal and exit 2, an applied setting that changes what the
engine or server does), and command lines from vLLM's documentation start unchanged."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent / "server"))  # the server tests' harness

from server_harness import free_port, serve, wait_until_up  # noqa: E402

from stepserve.cli import build_parser, main  # noqa: E402
from stepserve.cli.engine_flags import config_overrides  # noqa: E402
from stepserve.cli.vllm_serve_flags import (  # noqa: E402
    ADDED_DEST,
    TABLE,
    Kind,
    Usage,
    check_vllm_flags,
    parse_usage,
)
from stepserve.config.errors import UsageError  # noqa: E402
from stepserve.model.presets import resolve_model  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "vllm-0.32.0" / "serve_help_all.txt"
GiB, MiB = 1 << 30, 1 << 20


def fixture_usages() -> list[tuple[Usage, str]]:
    """(usage, what follows the first name) of every flag vLLM's help lists."""
    found = []
    for line in FIXTURE.read_text().splitlines():
        match = re.match(r"^  (-\S.*?)(?:\s{2,}\S.*)?$", line)
        if match:
            usage = parse_usage(match.group(1))
            found.append((usage, match.group(1)[len(usage.name):].split(", -")[0].strip()))
    return found


def choices_of(metavar: str) -> list[str]:
    """`{a,b}` or `['a', 'b']` as its values; [] for a metavar."""
    if match := re.fullmatch(r"\{([^}]*)\}", metavar):
        return match.group(1).split(",")
    if metavar.startswith("['"):
        return re.findall(r"'([^']*)'", metavar)
    return []


# ---- (i) the table is vLLM's list, no more and no less ----

def test_every_vllm_flag_is_in_the_table_and_every_row_is_a_vllm_flag():
    theirs = {frozenset(u.names): u.arity for u, _ in fixture_usages()}
    ours = {frozenset(f.usage.names): f.usage.arity for f in TABLE}
    assert len(theirs) > 300  # the fixture parsed
    assert sorted(map(sorted, theirs.keys() - ours.keys())) == []  # a new vLLM flag fails
    assert sorted(map(sorted, ours.keys() - theirs.keys())) == []  # a row vLLM lacks
    assert {k: v for k, v in ours.items() if theirs[k] != v} == {}  # as many values
    assert len(ours) == len(TABLE)  # no flag twice


ARITY_NARGS = {"switch": (0, "?"), "pair": (0, "?"), "value": (None, "?"),
               "values": ("+", "*"), "optional": ("?",)}


def command_parser(command: str):
    return next(a for a in build_parser()._actions if a.dest == "command").choices[command]


@pytest.mark.parametrize("command", ["serve", "generate", "bench", "simulate", "sweep"])
def test_the_commands_parse_each_flag_as_vllm_writes_it(command):
    """Serve has every name; the other engine commands every name they do not use for
    a flag of their own. Each reads as many values as vLLM's."""
    parser = command_parser(command)
    options, added = parser._option_string_actions, parser.get_default(ADDED_DEST)
    for flag in TABLE:
        if flag.kind is Kind.APPLIES and command != "serve":
            continue  # it applies on serve
        if flag.kind is not Kind.APPLIES and flag.usage.name not in added:
            assert command != "serve", flag.usage.name
            assert any(n in options for n in flag.usage.names)  # the command's own flag
            continue
        for name in flag.usage.names:
            assert name in options, (command, name)
            action = options[name]
            assert action.nargs in ARITY_NARGS[flag.usage.arity] or \
                (flag.usage.arity == "values" and action.__class__.__name__ in
                 ("_AppendAction", "_ExtendAction")), (command, name, action.nargs)


@pytest.mark.parametrize("usage, metavar", [
    (u, m) for u, m in fixture_usages() if choices_of(m)], ids=lambda x: getattr(x, "name", ""))
def test_each_of_vllms_choices_parses(usage, metavar):
    """No vLLM value is argparse's "invalid choice": applied ones map onto ours, the
    others reach the table's rule (a warning or a refusal with its reason)."""
    for value in choices_of(metavar):
        build_parser().parse_args(["serve", usage.name, value])


# ---- (ii) each kind does what it says ----

def sample_argv(flag, value: str | None = "x") -> list[str]:
    """The flag given once, as vLLM takes it."""
    if flag.usage.arity in ("switch", "pair", "optional") or value is None:
        return [flag.usage.name]
    return [flag.usage.name, value]


@pytest.fixture
def serve_calls(monkeypatch):
    """The ServeOptions each `stepserve serve` was run with (the server not started)."""
    seen = []
    monkeypatch.setattr("stepserve.cli.serve.run_serve", lambda o: seen.append(o) or 0)
    return seen


def one_line(capsys, start: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), err
    return lines[0]


NO_EFFECT = [f for f in TABLE if f.kind is Kind.NO_EFFECT]
SOME_VALUES = [f for f in TABLE if f.kind is Kind.SOME_VALUES]


@pytest.mark.parametrize("flag", NO_EFFECT, ids=lambda f: f.usage.name)
def test_a_flag_without_effect_warns_in_one_line_and_serves(flag, serve_calls, capsys):
    assert main(["serve", "default", *sample_argv(flag)]) == 0
    line = one_line(capsys, f"warning: {flag.usage.name} has no effect here: ")
    assert flag.reason in line and len(serve_calls) == 1
    for value in flag.takes:  # what stepserve does anyway: silent
        assert main(["serve", "default", *sample_argv(flag, value)]) == 0
        assert capsys.readouterr().err == ""


@pytest.mark.parametrize("flag", SOME_VALUES, ids=lambda f: f.usage.name)
def test_a_value_stepserve_cannot_honour_is_one_line_and_exit_2(flag, serve_calls, capsys):
    if flag.usage.arity in ("switch", "pair", "optional"):
        refused = [flag.usage.name]  # on
    else:
        refused = [flag.usage.name, "2" if flag.takes in (("1",), ("0",)) else "x"]
    assert main(["serve", "default", *refused]) == 2
    line = one_line(capsys, f"error: {flag.usage.name} = ")
    assert flag.reason in line and "allowed: " in line and serve_calls == []
    for value in flag.takes:  # the values that mean what stepserve does: silent
        argv = [f"--no-{flag.usage.name[2:]}"] if value == "false" else \
            [flag.usage.name, value]
        assert main(["serve", "default", *argv]) == 0, argv
        assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv, start", [
    (["--tensor-parallel-size", "1", "-pp", "1", "--data-parallel-size", "1"], None),
    (["--kv-cache-dtype", "auto", "--load-format", "safetensors", "--no-enable-lora"], None),
    (["-tp", "2"], "error: --tensor-parallel-size = '2': stepserve runs one unsharded engine"),
    (["--kv-cache-dtype", "fp8"], "error: --kv-cache-dtype = 'fp8': the KV cache is kept in "
                                  "the weights' dtype (--dtype); stepserve has no quantised "
                                  "KV cache; allowed: 'auto'"),
    (["--enable-lora", "--lora-modules", "sql=/adapters/sql"],
     "error: --enable-lora = 'true': stepserve serves the base model only"),
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 5}'],
     "error: --speculative-config = "),
    (["--load-format", "dummy"], "error: --load-format = 'dummy': stepserve loads the model "
                                 "folder's safetensors"),
    (["--enforce-eager"], "warning: --enforce-eager has no effect here: stepserve never "
                          "compiles graphs"),
    (["--trust-remote-code"], "warning: --trust-remote-code has no effect here: stepserve "
                              "runs its own model code"),
    (["--disable-log-stats"], "warning: --disable-log-stats has no effect here: stepserve "
                              "writes no periodic stats lines: /metrics has the numbers"),
    (["--enable-log-requests"], "warning: --enable-log-requests has no effect here: stepserve "
                                "logs no requests"),
    (["--async-scheduling"], "warning: --async-scheduling has no effect here"),
])
def test_the_flags_named_in_vllms_common_commands(argv, start, serve_calls, capsys):
    code = main(["serve", "default", *argv])
    if start is None:
        assert code == 0 and capsys.readouterr().err == ""
    else:
        assert code == (2 if start.startswith("error") else 0)
        one_line(capsys, start)


def test_a_vllm_config_file_feeds_the_same_table(tmp_path, serve_calls, capsys):
    path = tmp_path / "vllm.yaml"
    path.write_text("model: default\ntensor-parallel-size: 1\nenable-lora: false\n"
                    "hf-overrides: {}\nkv-cache-dtype: auto\nenforce-eager: true\n"
                    "api-key: [k1, k2]\nserved-model-name: [a, b]\nmax-logprobs: 5\n"
                    "generation-config: vllm\nenable-prompt-tokens-details: true\n")
    assert main(["serve", "--config", str(path)]) == 0
    one_line(capsys, "warning: --enforce-eager has no effect here")
    o = serve_calls[-1]
    assert (o.api_keys, o.served_model_name, o.max_logprobs) == (("k1", "k2"), ["a", "b"], 5)
    assert (o.generation_config, o.enable_prompt_tokens_details) == ("vllm", True)
    for bad, start in (("tensor-parallel-size: 2", "error: --tensor-parallel-size = '2'"),
                       ("speculative-config: {method: ngram}",
                        'error: --speculative-config = \'{"method": "ngram"}\''),
                       ("lora-modules: [sql=/adapters/sql]", "error: --lora-modules = ")):
        path.write_text(f"model: default\n{bad}\n")
        assert main(["serve", "--config", str(path)]) == 2
        one_line(capsys, start)


@pytest.mark.parametrize("command, base", [
    ("generate", ["--prompt", "x"]), ("bench", []), ("simulate", ["--scenario", "quickstart"]),
    ("sweep", ["--scenario", "quickstart"])])
def test_the_other_engine_commands_read_the_table_too(command, base):
    parse = build_parser().parse_args
    with pytest.raises(UsageError, match="--tensor-parallel-size = '4'"):
        check_vllm_flags(parse([command, *base, "-tp", "4"]))
    (line,) = check_vllm_flags(parse([command, *base, "--enforce-eager"]))
    assert line.startswith("warning: --enforce-eager has no effect here")
    assert check_vllm_flags(parse([command, *base, "--kv-cache-dtype", "auto"])) == []


def test_serve_help_stays_readable():
    help_text = command_parser("serve").format_help()
    assert "vLLM's other serve flags" in help_text
    assert "--enforce-eager" not in help_text and "--tensor-parallel-size" not in help_text
    assert "--chat-template" in help_text and "--max-logprobs" in help_text


# ---- applied: each changes what the engine or server does ----

@pytest.fixture
def built(capsys):
    """`stepserve serve ARGV` through the real CLI path up to the built engine: returns
    (exit status, engine, create_app's and make_server's keyword arguments); the HTTP
    server is not started. What earlier runs printed is dropped first."""
    def build(*argv: str):
        capsys.readouterr()
        got = {}

        def create_app(engine, **kwargs):
            got.update(engine=engine, kwargs=kwargs)
            return object()

        class Server:
            exit_code = 0

            def run(self):
                pass

        with pytest.MonkeyPatch.context() as mp:  # undone before a test serves for real
            mp.setattr("stepserve.server.api.create_app", create_app)
            mp.setattr("stepserve.server.http_server.make_server",
                       lambda *a, **k: got.update(server=k) or Server())
            code = main(["serve", *argv, "--port", "0"])
        if code:
            return code, None, None
        return code, got["engine"], {**got["kwargs"], **got["server"]}
    return build


@pytest.mark.parametrize("mode, dtype", [("auto", "auto"), ("none", "float32"),
                                         ("none", "bfloat16"), ("q4_1", "float32")])
def test_quantization_for_dtype_and_quantization_flags(mode, dtype):
    from stepserve.model.modes import quantization_for

    wanted = {"auto": "auto", "none": "auto", "q4_1": "q4_1"}[mode]
    assert quantization_for(wanted, dtype) == mode


def test_dtype_float32_serves_float_weights_not_q4_1(built):
    from stepserve.model.ggml_kernels import kernels_unavailable_reason

    small = ("--num-gpu-blocks-override", "16", "--max-model-len", "256")
    _, engine, _ = built("default", "--dtype", "float32", *small)
    assert (engine.runner.quantization, engine.runner.args.dtype) == ("none", "float32")
    _, engine, _ = built("default", "--dtype", "bfloat16", *small)
    assert (engine.runner.quantization, engine.runner.args.dtype) == ("none", "bfloat16")
    if kernels_unavailable_reason() is not None:
        pytest.skip("this CPU cannot run the Q4_1 kernels")
    for argv in ([], ["--dtype", "auto"], ["--dtype", "float32", "--quantization", "q4_1"],
                 ["--dtype", "float32", "-q", "q4_1"]):
        _, engine, _ = built("default", *argv, *small)
        assert engine.runner.quantization == "q4_1", argv


def test_dtype_half_with_q4_1_is_refused_in_one_line(built, capsys):
    assert built("default", "--dtype", "half", "--quantization", "q4_1")[0] == 2
    one_line(capsys, "error: quantization = 'q4_1' computes in float32, not float16")


TINY = ("tiny", "--num-gpu-blocks-override", "64", "--max-model-len", "256")


def tokenizer_copy(tmp_path: Path, template: str) -> Path:
    folder = tmp_path / "tok"
    folder.mkdir()
    tiny = resolve_model("tiny")
    shutil.copy(tiny / "tokenizer.json", folder)
    config = json.loads((tiny / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config,
                                                              "chat_template": template}))
    return folder


def test_tokenizer_folder_is_the_one_used(built, tmp_path, capsys):
    folder = tokenizer_copy(tmp_path, "TOK{{ messages[0]['content'] }}")
    _, engine, _ = built(*TINY, "--tokenizer", str(folder))
    assert engine.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "TOKhi"
    assert built(*TINY, "--tokenizer", "meta-llama/Llama-2-7b-hf")[0] == 2
    one_line(capsys, "error: --tokenizer 'meta-llama/Llama-2-7b-hf': not a folder holding a "
                     "tokenizer.json (stepserve never downloads")
    assert built(*TINY, "--tokenizer", "default")[0] == 2  # 49,152 tokens > tiny's 512
    one_line(capsys, "error: tokenizer ")


def test_chat_template_file_or_one_line_template(built, tmp_path, capsys):
    chat = [{"role": "user", "content": "hi"}]
    path = tmp_path / "t.jinja"
    path.write_text("FILE[{{ messages[0]['content'] }}]")
    _, engine, _ = built(*TINY, "--chat-template", str(path))
    assert engine.tokenizer.apply_chat_template(chat) == "FILE[hi]"
    _, engine, _ = built(*TINY, "--chat-template", "{{ messages[0]['content'] }}\\nend")
    assert engine.tokenizer.apply_chat_template(chat) == "hi\nend"  # its \n decoded
    for bad, start in (("./no-such-template.jinja", "error: --chat-template "
                                                    "'./no-such-template.jinja': no such file"),
                       ("{% if %}", "error: --chat-template: the template does not compile")):
        assert built(*TINY, "--chat-template", bad)[0] == 2
        one_line(capsys, start)


def completion(s, **body) -> httpx.Response:
    return httpx.post(s.url + "/v1/completions",
                      json={"model": "tiny", "prompt": "Hello", **body}, timeout=60)


def test_max_logprobs_changes_what_is_refused(built):
    _, engine, _ = built(*TINY, "--max-logprobs", "5")
    assert engine.max_logprobs == 5
    with serve(engine) as s:
        ok = completion(s, max_tokens=2, logprobs=5)
        assert ok.status_code == 200
        assert len(ok.json()["choices"][0]["logprobs"]["top_logprobs"][0]) >= 5
        for body, param in (({"logprobs": 6}, "logprobs"),
                            ({"prompt_logprobs": 6}, "prompt_logprobs")):
            r = completion(s, max_tokens=2, **body)
            what = "sample" if param == "logprobs" else "prompt"
            assert r.status_code == 400 and r.json()["error"]["param"] == param
            assert r.json()["error"]["message"] == \
                f"Requested {what} logprobs of 6, which is greater than max allowed: 5"
        r = httpx.post(s.url + "/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2, "logprobs": True, "top_logprobs": 6}, timeout=60)
        assert r.status_code == 400 and "greater than max allowed: 5" in r.text
    _, engine, _ = built(*TINY)  # vLLM's default, 20
    assert engine.max_logprobs == 20
    with serve(engine) as s:
        r = completion(s, max_tokens=2, logprobs=21)
        assert r.status_code == 400 and "greater than max allowed: 20" in r.text
    _, engine, _ = built(*TINY, "--max-logprobs", "-1")  # -1: the whole vocabulary
    assert engine.max_logprobs == engine.runner.args.vocab_size


def test_an_engines_max_logprobs_holds_offline_too():
    from stepserve.core.request import SamplingParams

    engine = tiny_engine("--num-gpu-blocks-override", "64")
    for field in ("logprobs", "prompt_logprobs"):
        with pytest.raises(ValueError, match="of 21, which is greater than max allowed: 20"):
            engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, **{field: 21}))
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, logprobs=20))
    engine.run_until_done()


def test_the_default_models_generation_config_holds_no_sampling_defaults():
    from stepserve.model.generation_config import SamplingDefaults, sampling_defaults

    folder = resolve_model("default")
    on_disk = json.loads((folder / "generation_config.json").read_text())
    assert not {"temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                "max_new_tokens"} & on_disk.keys()
    got = sampling_defaults("auto", folder)
    assert got.given() == {} and got == SamplingDefaults(source=got.source)


def test_generation_config_defaults_fill_what_a_request_leaves_out(built, tmp_path, capsys):
    folder = tmp_path / "gen"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.0, "top_k": 1, "max_new_tokens": 3, "do_sample": False}))
    _, engine, kwargs = built(*TINY, "--generation-config", str(folder))
    defaults = kwargs["sampling_defaults"]
    assert defaults.given() == {"temperature": 0.0, "top_k": 1, "max_tokens": 3}
    with serve(engine, sampling_defaults=defaults) as s:
        one = completion(s, ignore_eos=True).json()
        assert one["usage"]["completion_tokens"] == 3  # max_new_tokens caps the default 16
        asked = completion(s, max_tokens=10, ignore_eos=True).json()
        assert asked["usage"]["completion_tokens"] == 3  # and a request's own, as vLLM
        again = completion(s, ignore_eos=True).json()
        assert again["choices"][0]["text"] == one["choices"][0]["text"]  # temperature 0
    _, engine, kwargs = built(*TINY, "--generation-config", str(folder),
                              "--override-generation-config", '{"max_new_tokens": 5}')
    assert kwargs["sampling_defaults"].max_tokens == 5
    _, engine, kwargs = built(*TINY, "--generation-config", "vllm")
    with serve(engine, sampling_defaults=kwargs["sampling_defaults"]) as s:
        r = completion(s, ignore_eos=True).json()
        assert r["usage"]["completion_tokens"] == 16  # vLLM's own default
    for argv, start in (
            (["--generation-config", str(tmp_path)], "error: --generation-config "),
            (["--override-generation-config", '{"temperature": 7}'],
             "error: --override-generation-config: temperature = 7: must be"),
            (["--override-generation-config", '{"beams": 2}'],
             "error: --override-generation-config: 'beams' is not a sampling default")):
        assert built(*TINY, *argv)[0] == 2
        one_line(capsys, start)


def test_a_requests_own_sampling_fields_win_over_the_defaults():
    from stepserve.model.generation_config import SamplingDefaults
    from stepserve.server.protocol import CompletionRequest
    from stepserve.server.serving import sampling_params

    d = SamplingDefaults(temperature=0.3, top_p=0.5, top_k=7, min_p=0.1,
                         repetition_penalty=1.2)
    left_out = sampling_params(CompletionRequest(prompt="x"), 4, defaults=d)
    assert (left_out.temperature, left_out.top_p, left_out.top_k, left_out.min_p,
            left_out.repetition_penalty) == (0.3, 0.5, 7, 0.1, 1.2)
    given = sampling_params(CompletionRequest(prompt="x", temperature=1.0, top_p=1.0,
                                              top_k=-1, min_p=0.0, repetition_penalty=1.0),
                            4, defaults=d)
    assert (given.temperature, given.top_p, given.top_k, given.min_p,
            given.repetition_penalty) == (1.0, 1.0, 0, 0.0, 1.0)


def test_enable_prompt_tokens_details_reaches_the_serving_context(built):
    args = build_parser().parse_args(["serve", "--enable-prompt-tokens-details"])
    assert args.enable_prompt_tokens_details is True
    assert build_parser().parse_args(["serve"]).enable_prompt_tokens_details is False
    _, engine, kwargs = built(*TINY, "--enable-prompt-tokens-details")
    assert kwargs["enable_prompt_tokens_details"] is True
    with serve(engine, enable_prompt_tokens_details=True) as s:
        assert s.app.state.ctx.enable_prompt_tokens_details is True
    with serve(engine) as s:
        assert s.app.state.ctx.enable_prompt_tokens_details is False


def test_disable_uvicorn_access_log_reaches_the_server(built):
    assert built(*TINY)[2]["access_log"] is True
    assert built(*TINY, "--disable-uvicorn-access-log")[2]["access_log"] is False


def hf_snapshot(tmp_path: Path, commit: str = "a" * 40) -> Path:
    """A Hugging Face cache entry holding the tiny model at `commit`, ref main."""
    repo = tmp_path / "models--org--tiny"
    folder = repo / "snapshots" / commit
    shutil.copytree(resolve_model("tiny"), folder)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return folder


def test_revision_must_be_what_the_folder_holds(built, tmp_path, capsys):
    folder = hf_snapshot(tmp_path)
    small = ("--num-gpu-blocks-override", "64", "--max-model-len", "256")
    for revision in ("main", "a" * 40, "aaaaaaa"):
        assert built(str(folder), *small, "--revision", revision)[0] == 0
    assert built(str(folder), *small, "--revision", "v2.0")[0] == 2
    one_line(capsys, f"error: --revision 'v2.0': stepserve never downloads, and {folder} "
                     f"holds {'a' * 40}, main")
    assert built(*TINY, "--revision", "main")[0] == 2  # a preset's folder records none
    one_line(capsys, "error: --revision 'main': stepserve never downloads, and ")
    assert built(*TINY, "--tokenizer-revision", "main")[0] == 2
    one_line(capsys, "error: --tokenizer-revision 'main'")


@pytest.mark.parametrize("block_size", ["1", "8", "32", "64", "128"])
def test_vllms_block_sizes_run_and_answer_as_the_default(block_size):
    from stepserve.core.request import SamplingParams
    from stepserve.engine.llm_engine import LLMEngine

    def greedy(*argv):
        args = build_parser().parse_args(["serve", "tiny", "--max-model-len", "256",
                                          "--kv-cache-memory-bytes", "4MiB", *argv])
        engine = LLMEngine("tiny", config_overrides(args).apply())
        params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
        reqs = [engine.add_request([3 + i] * (5 + 9 * i), params) for i in range(3)]
        engine.run_until_done()
        return engine, [list(r.output_token_ids) for r in reqs]

    engine, out = greedy("--block-size", block_size)
    assert engine.runner.block_size == engine.scheduler.kv.block_size == int(block_size)
    assert out == greedy()[1]  # our default, 16


KV_BYTES_PER_BLOCK = 1024 * 16  # the tiny model in float32: 1 KiB a token, 16 a block


def tiny_engine(*argv: str):
    from stepserve.engine.llm_engine import LLMEngine

    args = build_parser().parse_args(["serve", "tiny", "--max-model-len", "256", *argv])
    return LLMEngine("tiny", config_overrides(args).apply())


def test_vllm_cpu_kvcache_space_sizes_the_kv_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    assert tiny_engine().scheduler.kv.num_gpu_blocks == GiB // KV_BYTES_PER_BLOCK
    # wins over the utilization, as in vLLM's CPU build; a setting given wins over it
    assert tiny_engine("--gpu-memory-utilization", "0.9").scheduler.kv.num_gpu_blocks == \
        GiB // KV_BYTES_PER_BLOCK
    assert tiny_engine("--kv-cache-memory-bytes", "8MiB").scheduler.kv.num_gpu_blocks == 512
    for bad in ("1.5", "0", "4GiB"):
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", bad)
        with pytest.raises(ValueError, match=f"VLLM_CPU_KVCACHE_SPACE = '{bad}': must be"):
            tiny_engine()
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "")  # empty: unset, as vLLM
    assert tiny_engine().scheduler.kv.num_gpu_blocks != GiB // KV_BYTES_PER_BLOCK


def test_gpu_memory_utilization_0_3_on_a_busy_machine_is_not_refused(monkeypatch):
    # 16 GiB of RAM, this process holding 0.5 GiB. With 2 GiB available (others hold the
    # rest), 0.1 gives 1.6 - 0.5 = 1.1 GiB of cache, which fits; 0.3's 4.3 GiB does not.
    # With 6 GiB available 0.3 starts, where counting the others' 10 GiB refused it.
    monkeypatch.setattr("stepserve.model.kv_store.memory_total_and_free",
                        lambda device: (16 * GiB, 2 * GiB))
    monkeypatch.setattr("stepserve.model.kv_store.process_rss", lambda: GiB // 2)
    engine = tiny_engine("--gpu-memory-utilization", "0.1")
    assert engine.scheduler.kv.num_gpu_blocks == (int(0.1 * 16 * GiB) - GiB // 2) // \
        KV_BYTES_PER_BLOCK
    with pytest.raises(ValueError, match="only 2.00 GiB of RAM is available"):
        tiny_engine("--gpu-memory-utilization", "0.3")
    monkeypatch.setattr("stepserve.model.kv_store.memory_total_and_free",
                        lambda device: (16 * GiB, 6 * GiB))  # busy, but room for 0.3's
    assert tiny_engine("--gpu-memory-utilization", "0.3").scheduler.kv.num_gpu_blocks == \
        (int(0.3 * 16 * GiB) - GiB // 2) // KV_BYTES_PER_BLOCK


@pytest.mark.parametrize("argv, field, want", [
    (["--max-model-len", "1k"], "max_model_len", 1000),
    (["--max-model-len", "2K"], "max_model_len", 2048),
    (["--max-model-len", "1.5k"], "max_model_len", 1500),
    (["--max-model-len", "auto"], "max_model_len", 4096),  # the default
    (["--max-model-len", "-1"], "max_model_len", 4096),
    (["--max-num-batched-tokens", "16K"], "max_num_batched_tokens", 16384),
    (["--prefix-caching-hash-algo", "sha256_cbor"], "prefix_caching_hash_algo", "sha256"),
    (["--prefix-caching-hash-algo", "xxhash_cbor"], "prefix_caching_hash_algo", "xxhash"),
    (["--device-memory-utilization", "0.5"], "gpu_memory_utilization", 0.5),
])
def test_vllms_values_of_applied_settings(argv, field, want):
    c = config_overrides(build_parser().parse_args(["serve", *argv])).apply()
    section = c.scheduler if hasattr(c.scheduler, field) else c.cache
    assert getattr(section, field) == want


@pytest.mark.parametrize("text", ["1.5K", "k", "1kk", "-5"])
def test_a_bad_count_is_one_line(text, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["serve", "--max-model-len", text])
    assert e.value.code == 2
    one_line(capsys, "stepserve serve: error: argument --max-model-len: cannot read")


def test_vllms_spellings_of_our_own_flags(serve_calls, capsys):
    assert main(["serve", "default", "--api-key", "k1", "k2", "--log-level", "INFO",
                 "--uvicorn-log-level", "debug", "-q", "none"]) == 0
    o = serve_calls[-1]
    assert (o.api_keys, o.log_level, o.quantization) == (("k1", "k2"), "info", "none")
    assert main(["serve", "default", "--log-level", "NOTSET"]) == 0
    with pytest.raises(SystemExit) as e:  # vLLM's --help=all: the whole help
        main(["serve", "default", "--help=all"])
    assert e.value.code == 0 and "vLLM's other serve flags" in capsys.readouterr().out


# ---- (iii) vLLM's documented command lines start `stepserve serve` unchanged ----

# (page of vLLM's docs, the command as it is written there); only the model is ours
DOCS = [
    ("getting_started/quickstart.md", "vllm serve Qwen/Qwen2.5-1.5B-Instruct"),
    ("getting_started/quickstart.md (On Attention Backends)",
     "vllm serve Qwen/Qwen2.5-1.5B-Instruct --attention-backend FLASH_ATTN"),
    ("serving/openai_compatible_server.md",
     "vllm serve NousResearch/Meta-Llama-3-8B-Instruct --dtype auto --api-key token-abc123"),
    ("serving/openai_compatible_server.md (Chat Template)",
     "vllm serve <model> --chat-template ./path-to-chat-template.jinja"),
    ("deployment/k8s.md (Deployment with CPUs)", "vllm serve meta-llama/Llama-3.2-1B-Instruct"),
    ("deployment/k8s.md (NVIDIA GPU)",
     "vllm serve mistralai/Mistral-7B-Instruct-v0.3 --trust-remote-code "
     "--enable-chunked-prefill --max_num_batched_tokens 1024"),
    ("deployment/k8s.md (AMD GPU)",
     "vllm serve mistralai/Mistral-7B-v0.3 --port 8000 --trust-remote-code "
     "--enable-chunked-prefill --max_num_batched_tokens 1024"),
    ("getting_started/installation/cpu.md (How to launch a vLLM service on CPU?)",
     "VLLM_CPU_KVCACHE_SPACE=40 VLLM_CPU_OMP_THREADS_BIND=0-30 "
     "vllm serve facebook/opt-125m --dtype=bfloat16"),
    ("configuration/serve_args.md (Configuration file)", "vllm serve --config config.yaml"),
    ("deployment/frameworks/open-webui.md", "vllm serve qwen/Qwen1.5-0.5B-Chat"),
    ("deployment/frameworks/dify.md", "vllm serve Qwen/Qwen1.5-7B-Chat"),
    ("cli/README.md (serve)", "vllm serve meta-llama/Llama-2-7b-hf --port 8100"),
    ("configuration/optimization.md (Parallel Processing)",
     "vllm serve Qwen/Qwen2.5-VL-3B-Instruct --api-server-count 4"),
    ("deployment/nginx.md (the container's arguments)",
     "vllm serve --model meta-llama/Llama-2-7b-chat-hf"),
]
# serve_args.md's file, as written there
CONFIG_YAML = ('# config.yaml\n\nmodel: meta-llama/Llama-3.1-8B-Instruct\nhost: "127.0.0.1"\n'
               'port: 6379\nuvicorn-log-level: "info"\n')
# the same pages' commands that stepserve refuses, with the reason
DOCS_REFUSED = [
    ("cli/README.md (serve)", "vllm serve meta-llama/Llama-2-7b-hf --uds /tmp/vllm.sock",
     "error: --uds = '/tmp/vllm.sock': stepserve listens on TCP only"),
    ("configuration/optimization.md (Parallel Processing)",
     "vllm serve Qwen/Qwen2.5-VL-3B-Instruct --api-server-count 4 -dp 2",
     "error: --data-parallel-size = '2': stepserve runs one unsharded engine"),
]


def ours(command: str, model: str, folder: Path) -> tuple[dict[str, str], list[str]]:
    """A documented command as (its environment, `stepserve serve`'s argv): `vllm serve`
    becomes `serve`, the model `model`, the config file written to `folder`."""
    words = command.split()
    env = dict(w.split("=", 1) for w in words[:words.index("vllm")])
    argv = words[words.index("vllm") + 2:]
    models = {"Qwen/", "NousResearch/", "<model>", "meta-llama/", "mistralai/", "facebook/",
              "qwen/"}
    argv = [model if any(w.startswith(m) for m in models) else w for w in argv]
    (folder / "config.yaml").write_text(CONFIG_YAML.replace("meta-llama/Llama-3.1-8B-Instruct",
                                                            model))
    argv = [str(folder / w) if w == "config.yaml" else w for w in argv]
    return env, argv


@pytest.mark.parametrize("page, command", DOCS, ids=[c for _, c in DOCS])
def test_a_documented_command_parses_into_settings(page, command, tmp_path, monkeypatch,
                                                   serve_calls, capsys):
    env, argv = ours(command, "default", tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["serve", *argv]) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "error" not in err and all(line.startswith("warning: ") for line in
                                      err.splitlines()), err
    o = serve_calls[-1]
    assert o.model == "default"
    o.config.apply()  # the settings hold together
    if "--api-key" in command:
        assert o.api_keys == ("token-abc123",)
    if "max_num_batched_tokens" in command:
        c = o.config.apply()
        assert (c.scheduler.max_num_batched_tokens, c.scheduler.enable_chunked_prefill) == \
            (1024, True)
        assert "warning: --trust-remote-code has no effect here" in err
    if "--config" in command:
        assert (o.host, o.port, o.uvicorn_log_level) == ("127.0.0.1", 6379, "info")
    if "--dtype=bfloat16" in command:
        from stepserve.model.modes import quantization_for

        assert quantization_for(o.quantization, o.dtype) == "none" and o.dtype == "bfloat16"
    if "--port 8100" in command:
        assert o.port == 8100


@pytest.mark.parametrize("page, command, start", DOCS_REFUSED,
                         ids=[c for _, c, _ in DOCS_REFUSED])
def test_a_documented_command_stepserve_cannot_honour_is_refused(page, command, start,
                                                                 tmp_path, serve_calls,
                                                                 capsys):
    _, argv = ours(command, "default", tmp_path)
    assert main(["serve", *argv]) == 2 and serve_calls == []
    one_line(capsys, start)


def start_documented(command: str, tmp_path: Path, *appended: str):
    """The documented command on the tiny model in its own process, with `appended`
    (later flags win: a free port and a small KV pool for this machine)."""
    env, argv = ours(command, "tiny", tmp_path)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepserve", "serve", *argv, *appended, "--port", str(port),
         "--num-gpu-blocks-override", "256", "--max-model-len", "512"],
        cwd=tmp_path, env={**os.environ, **env}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, timeout_s=120, alive=lambda: proc.poll() is None, poll_s=0.2)
    except RuntimeError:
        proc.kill()
        raise AssertionError(proc.communicate()[0]) from None
    return proc, url


def stop(proc) -> str:
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    return out


@pytest.mark.slow
def test_documented_api_key_command_serves_with_the_key(tmp_path):
    import openai

    proc, url = start_documented(DOCS[2][1], tmp_path)
    try:
        assert httpx.get(url + "/v1/models").status_code == 401
        client = openai.OpenAI(base_url=url + "/v1", api_key="token-abc123", max_retries=0)
        r = client.completions.create(model="tiny", prompt="Hello", max_tokens=3,
                                      extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 3
    finally:
        out = stop(proc)
    assert "warning" not in out


@pytest.mark.slow
def test_documented_chat_template_command_renders_with_that_template(tmp_path):
    (tmp_path / "path-to-chat-template.jinja").write_text(
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    proc, url = start_documented(DOCS[3][1], tmp_path)
    try:
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        got = httpx.post(url + "/tokenize", json=chat).json()["tokens"]
        from stepserve.model.tokenizer import Tokenizer

        tokenizer = Tokenizer(resolve_model("tiny"))
        assert got == tokenizer.encode("[user] hi\n", add_special_tokens=False)
        assert got != tokenizer.encode_chat(chat["messages"])  # not the folder's template
        r = httpx.post(url + "/v1/chat/completions", json={**chat, "max_tokens": 2})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(got)
    finally:
        stop(proc)


@pytest.mark.slow
def test_documented_k8s_command_serves_and_warns_once(tmp_path):
    proc, url = start_documented(DOCS[6][1], tmp_path)
    try:
        r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "Hello",
                                                      "max_tokens": 3, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    finally:
        out = stop(proc)
    assert "warning: --trust-remote-code has no effect here" in out


def test_fingerprint_mode_custom_without_a_value_is_one_line_before_loading(capsys):
    assert main(["serve", "--model", "tiny", "--port", str(free_port()),
                 "--fingerprint-mode", "custom"]) == 2
    err = capsys.readouterr().err
    assert "needs a fingerprint value" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as e:
        main(["serve", "--model", "tiny", "--fingerprint-mode", "sometimes"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err
