"""Config: the incidents' YAML shape, vLLM-style flags, and clear rejections."""

import argparse

import pytest

from stepserve.cli.engine_flags import add_config_arguments, config_overrides
from stepserve.config.load import ConfigOverrides, apply_nested, load_config, parse_bool
from stepserve.config.settings import ConfigError, EngineConfig

SEED_YAML = """
replicas: 3
scheduler:
  max_num_seqs: 40
  max_num_batched_tokens: 8192
  enable_chunked_prefill: true
  max_num_partial_prefills: 1
  long_prefill_token_threshold: 2048
queue:
  max_waiting: 24
  aging_after_s: 20
"""


def test_loads_the_seed_shape(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(SEED_YAML)
    c = load_config(p)
    assert c.replicas == 3 and c.scheduler.max_num_seqs == 40
    assert c.scheduler.long_prefill_token_threshold == 2048
    assert c.queue.max_waiting == 24 and c.queue.aging_after_s == 20.0


def test_flat_keys_go_to_their_section():
    c = apply_nested(EngineConfig(), {"max_num_batched_tokens": 4096, "max_waiting": 5,
                                      "block_size": 32})
    assert c.scheduler.max_num_batched_tokens == 4096
    assert c.queue.max_waiting == 5 and c.cache.block_size == 32


def test_vllm_style_flags_override_the_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(SEED_YAML)
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    add_config_arguments(parser)
    args = parser.parse_args(["--config", str(p), "--max-num-seqs", "64",
                              "--no-enable-chunked-prefill", "--max-model-len", "8192",
                              "--policy", "priority"])
    c = config_overrides(args).apply()
    assert c.scheduler.max_num_seqs == 64 and not c.scheduler.enable_chunked_prefill
    assert c.scheduler.policy == "priority" and c.replicas == 3


def test_config_overrides_apply_the_file_then_the_settings(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(SEED_YAML)
    overrides = ConfigOverrides(str(p), {"max_num_seqs": 64, "policy": "priority"})
    c = overrides.apply()
    assert c.scheduler.max_num_seqs == 64 and c.replicas == 3
    assert c.scheduler.policy == "priority" and c.queue.max_waiting == 24
    base = EngineConfig().replace(max_waiting=7)
    only_settings = overrides.apply_settings(base)
    assert only_settings.scheduler.max_num_seqs == 64 and only_settings.replicas == 1
    assert only_settings.queue.max_waiting == 7
    assert not ConfigOverrides().given and ConfigOverrides().apply(base) == base


def test_bool_flags_take_true_or_false_and_name_a_bad_value(capsys):
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    assert parser.parse_args(["--enable-chunked-prefill", "off"]).enable_chunked_prefill is False
    with pytest.raises(SystemExit):
        parser.parse_args(["--enable-chunked-prefill", "maybe"])
    assert "expected true or false, got 'maybe'" in capsys.readouterr().err
    assert parse_bool("on") is True and parse_bool("0") is False
    with pytest.raises(ValueError, match="expected true or false, got 'maybe'"):
        parse_bool("maybe")


@pytest.mark.parametrize("data, message", [
    ({"scheduler": {"max_num_seqs": -1}},
     "scheduler.max_num_seqs = -1: must be an integer in [1, 65536]"),
    ({"scheduler": {"max_num_batched_tokens": 0}}, "max_num_batched_tokens = 0"),
    ({"scheduler": {"max_num_seqs": "many"}},
     "max_num_seqs = 'many': must be an integer in [1, 65536]"),
    ({"scheduler": {"max_num_seqs": True}}, "max_num_seqs = True: must be an integer in [1, "),
    ({"scheduler": {"policy": "lifo"}}, "must be one of fcfs, priority, srpt, fair"),
    ({"scheduler": {"max_num_batched_tokens": 1024, "long_prefill_token_threshold": 2048}},
     "cannot exceed the step budget"),
    ({"scheduler": {"max_num_partial_prefills": 1, "max_long_partial_prefills": 2}},
     "must be <= max_num_partial_prefills"),
    ({"scheduler": {"enable_chunked_prefill": False, "max_num_batched_tokens": 2048}},
     "without chunked prefill it must be >= max_model_len"),
    ({"queue": {"max_queue_time_s": -1}}, "queue.max_queue_time_s = -1"),
    ({"cache": {"watermark": 0.9}}, "cache.watermark = 0.9: must be a finite number in [0, 0.5]"),
    ({"scheduler": {"max_num_seq": 4}}, "unknown setting scheduler.max_num_seq"),
    ({"max_num_seq": 4}, "unknown setting 'max_num_seq'"),
    ({"scheduler": 5}, "scheduler: must be a mapping"),
    ({"replicas": 0}, "replicas = 0"),
])
def test_bad_values_are_rejected_naming_key_value_and_what_is_allowed(data, message):
    with pytest.raises(ConfigError) as e:
        apply_nested(EngineConfig(), data)
    assert message in str(e.value)


def test_bad_yaml_file_is_named(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("scheduler: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "none.yaml")
