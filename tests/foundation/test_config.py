import argparse

import pytest

from sglang_replayssm.config import (
    CONFIG_FILE_ENV, ConfigError, ReplaySSMConfig, SETTINGS, add_flags, from_env, from_flags,
)


def _flags(argv):
    p = argparse.ArgumentParser(allow_abbrev=False)
    add_flags(p)
    ns, rest = p.parse_known_args(argv)
    return ns, rest


def test_defaults_are_inert():
    cfg = from_env({})
    assert cfg == ReplaySSMConfig()
    assert cfg.enable is False and cfg.buffer_len == 16
    assert cfg.ssm_types == ("mamba2", "gdn")


def test_env_values_parsed_and_sourced():
    cfg = from_env({"SGLANG_REPLAYSSM_ENABLE": "yes", "SGLANG_REPLAYSSM_BUFFER_LEN": "8",
                    "SGLANG_REPLAYSSM_SSM_TYPES": "gdn", "SGLANG_REPLAYSSM_LOG_LEVEL": "Warning"})
    assert (cfg.enable, cfg.buffer_len, cfg.ssm_types, cfg.log_level) == (True, 8, ("gdn",), "warning")
    assert cfg.source["buffer_len"] == "env"


@pytest.mark.parametrize("var,value,needle", [
    ("SGLANG_REPLAYSSM_BUFFER_LEN", "0", "SGLANG_REPLAYSSM_BUFFER_LEN"),
    ("SGLANG_REPLAYSSM_BUFFER_LEN", "abc", "[1, 256]"),
    ("SGLANG_REPLAYSSM_LOG_LEVEL", "loud", "warning"),
    ("SGLANG_REPLAYSSM_SSM_TYPES", "mamba3", "accepted: mamba2, gdn"),
    ("SGLANG_REPLAYSSM_ENABLE", "maybe", "not a boolean"),
    ("SGLANG_REPLAYSSM_BUFER_LEN", "8", "unknown environment variable"),
])
def test_bad_env_values_name_the_setting(var, value, needle):
    with pytest.raises(ConfigError) as e:
        from_env({var: value})
    assert needle in str(e.value)


def test_yaml_file_then_env_then_flags(tmp_path):
    y = tmp_path / "r.yaml"
    y.write_text("buffer_len: 4\nssm-types: gdn\nlog_level: debug\n")
    env = {CONFIG_FILE_ENV: str(y), "SGLANG_REPLAYSSM_BUFFER_LEN": "6"}
    cfg = from_env(env)
    assert (cfg.buffer_len, cfg.ssm_types, cfg.log_level) == (6, ("gdn",), "debug")
    assert cfg.source["ssm_types"].startswith("yaml:")
    ns, rest = _flags(["--replayssm-buffer-len", "12", "--model-path", "m"])
    cfg2 = from_flags(ns, env)
    assert cfg2.buffer_len == 12 and cfg2.enable is True and rest == ["--model-path", "m"]


@pytest.mark.parametrize("text,needle", [
    ("buffer_len: [1, 2\n", "not valid YAML"),
    ("- 1\n- 2\n", "must hold a mapping"),
    ("bufferlen: 3\n", "unknown setting 'bufferlen'"),
    ("buffer_len: -1\n", "[1, 256]"),
])
def test_bad_yaml(tmp_path, text, needle):
    y = tmp_path / "bad.yaml"
    y.write_text(text)
    with pytest.raises(ConfigError) as e:
        from_env({CONFIG_FILE_ENV: str(y)})
    assert needle in str(e.value)


def test_missing_yaml_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        from_env({CONFIG_FILE_ENV: str(tmp_path / "nope.yaml")})


def test_flag_errors_name_the_flag():
    ns, _ = _flags(["--replayssm-buffer-len", "0"])
    with pytest.raises(ConfigError, match="--replayssm-buffer-len"):
        from_flags(ns, {})


def test_disable_flag_and_env_round_trip():
    ns, _ = _flags(["--replayssm-disable", "--replayssm-ssm-types", "mamba2"])
    cfg = from_flags(ns, {})
    assert cfg.enable is False
    again = from_env(cfg.to_env())
    assert again.as_dict() == cfg.as_dict()


def test_every_setting_has_help_flag_and_env():
    for s in SETTINGS:
        assert s.help and s.env.startswith("SGLANG_REPLAYSSM_") and s.flag.startswith("--replayssm-")
