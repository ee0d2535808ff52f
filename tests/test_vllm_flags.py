"""vLLM's serve flags and config file on our commands: each vLLM spelling (flag and YAML
key) parses to the same settings as ours, and each knob acts on the engine."""

from __future__ import annotations

import pytest

from stepserve.cli import build_parser, main
from stepserve.cli.engine_flags import config_overrides
from stepserve.config.settings import ConfigError, EngineConfig
from stepserve.config.sizes import parse_size

GiB, MiB = 1 << 30, 1 << 20


def settings(*argv: str, command: str = "serve") -> EngineConfig:
    args = build_parser().parse_args([command, *argv])
    return config_overrides(args).apply()


def yaml_settings(tmp_path, text: str, *argv: str, command: str = "serve") -> EngineConfig:
    path = tmp_path / "vllm.yaml"
    path.write_text(text)
    return settings("--config", str(path), *argv, command=command)


# ---- the table: vLLM's flag, its YAML form, our flag: one config ----

TABLE = [  # (vLLM flag tokens, YAML line, our flag tokens)
    (["--scheduling-policy", "priority"], "scheduling-policy: priority",
     ["--policy", "priority"]),
    (["--num-gpu-blocks-override", "300"], "num-gpu-blocks-override: 300",
     ["--num-gpu-blocks", "300"]),
    (["--kv-cache-memory-bytes", "4GiB"], "kv-cache-memory-bytes: 4GiB",
     ["--kv-cache-memory", str(4 * GiB)]),
    (["--kv-cache-memory-bytes", "4G"], "kv-cache-memory-bytes: 4G",
     ["--kv-cache-memory", str(4 * GiB)]),
    (["--kv-cache-memory-bytes", "512MiB"], "kv_cache_memory_bytes: 512MiB",
     ["--kv-cache-memory", str(512 * MiB)]),
    (["--kv-cache-memory-bytes", "4g"], "kv-cache-memory-bytes: 4g",
     ["--kv-cache-memory", str(4 * 10**9)]),
    (["--max_num_seqs", "40"], "max-num-seqs: 40", ["--max-num-seqs", "40"]),
    (["--max_num_batched_tokens=2048"], "max_num_batched_tokens: 2048",
     ["--max-num-batched-tokens", "2048"]),
    (["--max-model-len", "1024"], "max-model-len: 1024", ["--max-model-len", "1024"]),
    (["--enable_chunked_prefill", "false"], "enable-chunked-prefill: false",
     ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "4096"]),
    (["--gpu-memory-utilization", "0.5"], "gpu-memory-utilization: 0.5",
     ["--gpu-memory-utilization", "0.5"]),
    (["--swap-space", "4"], "swap-space: 4", ["--swap-space", "4"]),
    (["--block_size", "32"], "block-size: 32", ["--block-size", "32"]),
    (["--no-enable-prefix-caching"], "enable-prefix-caching: false",
     ["--enable-prefix-caching", "false"]),
]


@pytest.mark.parametrize("vllm_flags, yaml_line, ours", TABLE,
                         ids=[" ".join(r[0]) for r in TABLE])
def test_vllm_flag_and_yaml_key_give_our_settings(vllm_flags, yaml_line, ours, tmp_path):
    extra = ["--max-num-batched-tokens", "4096"] if "chunked" in yaml_line else []
    want = settings(*ours)
    assert settings(*vllm_flags, *extra) == want
    assert yaml_settings(tmp_path, yaml_line + "\n", *extra) == want
    assert want != EngineConfig() or not ours  # the row changes something


@pytest.mark.parametrize("command", ["generate", "simulate", "bench", "sweep"])
def test_the_other_engine_commands_take_them_too(command):
    base = {"generate": ["--prompt", "x"], "simulate": ["--scenario", "quickstart"],
            "bench": [], "sweep": ["--scenario", "quickstart"]}[command]
    c = settings(*base, "--max_num_seqs", "7", "--scheduling-policy", "priority",
                 "--num-gpu-blocks-override", "99", command=command)
    assert (c.scheduler.max_num_seqs, c.scheduler.policy, c.cache.num_gpu_blocks) == \
        (7, "priority", 99)


def test_a_flat_vllm_file_sets_command_flags_and_the_command_line_wins(tmp_path):
    path = tmp_path / "vllm.yaml"
    path.write_text("model: tiny\nport: 8123\nhost: 0.0.0.0\nseed: 5\ndtype: half\n"
                    "served-model-name: [chat]\nuvicorn-log-level: debug\n"
                    "max-num-seqs: 40\nmax-num-batched-tokens: 1024\n")
    args = build_parser().parse_args(["serve", "--config", str(path), "--port", "9000",
                                      "--max_num_seqs", "41"])
    assert (args.model, args.port, args.host, args.seed, args.dtype) == \
        ("tiny", 9000, "0.0.0.0", 5, "half")
    assert (args.served_model_name, args.uvicorn_log_level) == (["chat"], "debug")  # a list, as vLLM
    c = config_overrides(args).apply()
    assert c.scheduler.max_num_seqs == 41 and c.scheduler.max_num_batched_tokens == 1024


def test_our_nested_file_still_reads_beside_flat_vllm_keys(tmp_path):
    c = yaml_settings(tmp_path, "scheduler:\n  max_num_seqs: 12\nqueue:\n  max_waiting: 3\n"
                      "kv-cache-memory-bytes: 1GiB\nport: 8001\n")
    assert (c.scheduler.max_num_seqs, c.queue.max_waiting, c.cache.kv_cache_memory) == \
        (12, 3, GiB)


def test_an_unknown_key_in_the_file_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "vllm.yaml"
    path.write_text("max-num-seqs: 4\nno-such-flag: 1\n")
    assert main(["simulate", "--scenario", "quickstart", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no-such-flag" in err[0] and "vllm.yaml" in err[0], err


def test_positional_model_as_vllm_serve_takes_it(monkeypatch):
    seen = []
    monkeypatch.setattr("stepserve.cli.serve.run_serve", lambda o: seen.append(o) or 0)
    assert main(["serve", "tiny", "--seed", "3", "--uvicorn-log-level", "error",
                 "--dtype", "float"]) == 0
    assert main(["serve", "--model", "tiny"]) == 0
    assert main(["serve", "tiny", "--model", "other"]) == 0  # the positional wins
    assert [o.model for o in seen] == ["tiny", "tiny", "tiny"]
    assert (seen[0].seed, seen[0].uvicorn_log_level, seen[0].dtype) == (3, "error", "float")
    assert seen[1].seed == 0 and seen[1].dtype == "auto"  # vLLM's defaults


@pytest.mark.parametrize("text, want", [
    ("4GiB", 4 * GiB), ("4G", 4 * GiB), ("512MiB", 512 * MiB), ("4g", 4 * 10**9),
    ("4GB", 4 * 10**9), ("25.6k", 25_600), ("1K", 1024), ("1048576", MiB), ("2Ti", 2 << 40),
])
def test_sizes_read_as_vllm_reads_them(text, want):
    assert parse_size(text, one_letter=True) == want


@pytest.mark.parametrize("text", ["4 GiBs", "1.5", "iB", "-4G", "four"])
def test_a_bad_size_is_refused(text):
    with pytest.raises(ValueError):
        parse_size(text, one_letter=True)


def test_a_bad_size_on_the_command_line_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["serve", "--kv-cache-memory-bytes", "4 GiBs"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--kv-cache-memory-bytes" in err[0], err


def test_enable_prefix_caching_is_the_cache_setting_on_by_default(capsys):
    assert settings("--enable-prefix-caching") == EngineConfig()
    assert EngineConfig().cache.enable_prefix_caching
    assert not settings("--no-enable-prefix-caching").cache.enable_prefix_caching
    assert capsys.readouterr().err == ""  # a real setting: no warning any more


def test_the_lpm_policy_and_its_aging_are_settings_too(tmp_path):
    want = settings("--policy", "lpm", "--aging-after-s", "5")
    assert want.scheduler.policy == "lpm" and want.queue.aging_after_s == 5.0
    assert settings("--scheduling-policy", "lpm", "--aging-after-s", "5") == want
    assert yaml_settings(tmp_path, "scheduling-policy: lpm\naging-after-s: 5\n") == want


def test_priority_policy_values_are_vllms():
    assert settings("--scheduling-policy", "fcfs").scheduler.policy == "fcfs"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--scheduling-policy", "lifo"])


def test_swap_space_and_num_cpu_blocks_are_one_or_the_other():
    with pytest.raises(ConfigError, match="swap_space"):
        EngineConfig().replace(swap_space=1.0, num_cpu_blocks=8)


def test_the_simulator_refuses_real_memory_knobs(capsys):
    for flag in (["--swap-space", "4"], ["--gpu-memory-utilization", "0.9"]):
        assert main(["simulate", "--scenario", "quickstart", "--no-progress", *flag]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and flag[0][2:].replace("-", "_") in err[0], err


# ---- each knob acts on the engine (the tiny model) ----

KV_BYTES_PER_BLOCK = 1024 * 16  # the tiny model in float32: 1 KiB a token, 16 a block


def engine_for(*argv: str, runner=None):
    from stepserve.engine.llm_engine import LLMEngine

    args = build_parser().parse_args(["serve", "tiny", "--max-model-len", "256", *argv])
    overrides = config_overrides(args)
    return LLMEngine("tiny", overrides.apply(), runner=runner,
                     strict_max_model_len=overrides.sets("max_model_len"))


def test_num_gpu_blocks_override_sets_the_engines_kv_blocks():
    engine = engine_for("--num-gpu-blocks-override", "77")
    assert engine.runner.num_gpu_blocks == engine.scheduler.kv.num_gpu_blocks == 77


def test_kv_cache_memory_bytes_sizes_the_kv_cache():
    engine = engine_for("--kv-cache-memory-bytes", "8MiB")
    assert engine.scheduler.kv.num_gpu_blocks == 8 * MiB // KV_BYTES_PER_BLOCK == 512


def test_gpu_memory_utilization_sizes_kv_as_vllms_cpu_build(monkeypatch):
    # as vLLM's CPU build: this process may hold u x RAM, and the KV cache gets that less
    # what it holds already; other processes' memory counts only as what is not available.
    # A busy machine of 1 GiB: 600 MiB in use by others, 60 MiB held by this process.
    monkeypatch.setattr("stepserve.model.kv_store.memory_total_and_free",
                        lambda device: (GiB, GiB - 600 * MiB))
    monkeypatch.setattr("stepserve.model.kv_store.process_rss", lambda: 60 * MiB)
    blocks = {}
    for u in ("0.1", "0.3"):  # 0.3: refused before, when others' 600 MiB counted too
        engine = engine_for("--gpu-memory-utilization", u)
        blocks[u] = engine.scheduler.kv.num_gpu_blocks
        assert engine.runner.num_gpu_blocks == blocks[u]
        assert blocks[u] == (int(float(u) * GiB) - 60 * MiB) // KV_BYTES_PER_BLOCK
    assert blocks["0.3"] > blocks["0.1"] > 0
    with pytest.raises(ValueError, match="this process holds 0.06 GiB already"):
        engine_for("--gpu-memory-utilization", "0.05")  # 51 MiB < the 60 MiB held
    with pytest.raises(ValueError, match="only 0.41 GiB of RAM is available"):
        engine_for("--gpu-memory-utilization", "0.5")  # 452 MiB of KV > 424 MiB available


def test_swap_space_sizes_the_cpu_swap_pool_and_swapping_uses_it():
    engine = engine_for("--swap-space", "0.01", "--preemption-mode", "swap",
                        "--num-gpu-blocks-override", "24", "--max-num-seqs", "8")
    want = int(0.01 * GiB) // KV_BYTES_PER_BLOCK
    assert engine.runner.num_cpu_blocks == engine.scheduler.kv.cpu.num_blocks == want
    from stepserve.core.request import SamplingParams

    params = SamplingParams(max_tokens=80, temperature=0.0, ignore_eos=True)
    for i in range(8):  # 8 x (8 + 80) tokens need 44 blocks of 24: some must swap out
        engine.add_request([1 + i] * 8, params)
    engine.run_until_done()
    assert engine.scheduler.num_preemptions_total > 0


def test_seed_makes_unseeded_sampling_reproducible():
    from stepserve.cli.serve import seed_engine
    from stepserve.core.request import SamplingParams

    engine = engine_for("--num-gpu-blocks-override", "64")
    params = SamplingParams(max_tokens=12, temperature=1.0)

    def sample_with(seed: int) -> list[int]:
        seed_engine(seed)
        req = engine.add_request([5, 6, 7], params)
        engine.run_until_done()
        return list(req.output_token_ids)

    first = sample_with(7)
    assert sample_with(7) == first
    assert sample_with(8) != first


def test_max_model_len_over_the_models_is_an_error_not_a_clamp():
    with pytest.raises(ConfigError, match="max_model_len = 8192 is more than the model"):
        engine_for("--max-model-len", "8192", "--num-gpu-blocks-override", "600")
    from stepserve.engine.llm_engine import LLMEngine

    unasked = LLMEngine("tiny", EngineConfig().replace(max_model_len=8192, num_gpu_blocks=600))
    assert unasked.config.scheduler.max_model_len == 4096  # a default is still lowered


@pytest.mark.parametrize("where", ["flag", "yaml"])
def test_serve_with_max_model_len_over_the_limit_exits_2_with_one_line(where, tmp_path,
                                                                       capsys):
    if where == "flag":
        argv = ["--max-model-len", "100000"]
    else:
        (tmp_path / "c.yaml").write_text("max-model-len: 100000\n")
        argv = ["--config", str(tmp_path / "c.yaml")]
    assert main(["serve", "tiny", "--port", "0", "--num-gpu-blocks-override", "64",
                 *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "max_model_len = 100000" in err[0], err


@pytest.mark.parametrize("name, want", [("auto", "float32"), ("half", "float16"),
                                        ("float16", "float16"), ("bfloat16", "bfloat16"),
                                        ("float", "float32"), ("float32", "float32")])
def test_dtype_values_map_to_what_the_runner_runs_on_cpu(name, want):
    from stepserve.engine.dtypes import resolve_dtype

    assert resolve_dtype(name, "tiny", "cpu") == want


def test_dtype_half_runs_the_engine_in_float16():
    from stepserve.engine.dtypes import resolve_dtype
    from stepserve.engine.llm_engine import LLMEngine

    engine = LLMEngine("tiny", EngineConfig().replace(max_model_len=256, num_gpu_blocks=32),
                       dtype=resolve_dtype("half", "tiny", "cpu"))
    assert engine.runner.args.dtype == "float16"
    assert engine.runner.kv.kv.dtype.__str__() == "torch.float16"


@pytest.mark.parametrize("argv, names, model", [
    (["--model", "tiny", "--served-model-name", "a", "b", "--port", "5"], ["a", "b"], "tiny"),
    (["tiny", "--served-model-name", "a", "b"], ["a", "b"], "tiny"),
    (["--served-model-name", "a", "b", "--max-num-seqs", "3", "tiny"], ["a", "b"], "tiny"),
])
def test_several_served_names_stay_names_wherever_the_model_is_given(argv, names, model):
    # plain argparse gave the second name to `serve [MODEL]`: the server loaded "b"
    args = build_parser().parse_args(["serve", *argv])
    assert args.served_model_name == names and (args.model_tag or args.model) == model
