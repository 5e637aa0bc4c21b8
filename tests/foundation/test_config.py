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


# ---- the config in force: parsed once per process, or set by activate() ----

def test_current_parses_the_environment_once(monkeypatch):
    from sglang_replayssm import config

    monkeypatch.setenv("SGLANG_REPLAYSSM_BUFFER_LEN", "8")
    first = config.current()
    assert first.buffer_len == 8 and first.source["buffer_len"] == "env"
    monkeypatch.setenv("SGLANG_REPLAYSSM_BUFFER_LEN", "4")  # a running process never sees a later change
    assert config.current() is first
    config.reset_for_tests()  # what a test that changes the variables does
    assert config.current().buffer_len == 4


def test_activate_wins_over_the_environment(monkeypatch):
    from sglang_replayssm import config

    monkeypatch.setenv("SGLANG_REPLAYSSM_BUFFER_LEN", "8")
    chosen = ReplaySSMConfig(enable=True, buffer_len=32, ssm_types=("gdn",))
    assert config.activate(chosen) is chosen
    assert config.current() is chosen
    config.deactivate()
    assert config.current().buffer_len == 8 and config.current().enable is False


def test_a_bad_environment_is_not_cached(monkeypatch):
    from sglang_replayssm import config

    monkeypatch.setenv("SGLANG_REPLAYSSM_BUFFER_LEN", "0")
    for _ in range(2):  # raised each time, never kept as "the config"
        with pytest.raises(ConfigError, match="SGLANG_REPLAYSSM_BUFFER_LEN"):
            config.current()
    monkeypatch.setenv("SGLANG_REPLAYSSM_BUFFER_LEN", "2")
    assert config.current().buffer_len == 2


def test_kernels_take_the_activated_launch_config_file(monkeypatch, tmp_path):
    """The plugin hands the kernels its config's file (kernels.common never imports config.py); None there is
    the per-GPU file whatever the environment names; a reset hands back to the env override of standalone use."""
    from sglang_replayssm import config
    from sglang_replayssm.kernels import common

    named, env_file = tmp_path / "named.yaml", tmp_path / "env.yaml"
    monkeypatch.setenv(common.ENV_CONFIG_FILE, str(env_file))
    assert common.config_file() == env_file
    common.activate_config_file(str(named))
    assert common.config_file() == named
    assert common.config_file(str(env_file)) == env_file  # an explicit argument still wins
    common.activate_config_file(None)
    assert common.config_file() == common.CONFIG_DIR / f"{common.gpu_key()}.yaml"
    config.deactivate()
    assert common.config_file() == env_file


# ---- the deprecated name of replay_ring (one release): every spelling still works, with one line each ----

def test_staged_is_a_deprecated_alias_of_replay_ring(tmp_path, caplog):
    from sglang_replayssm import config

    config._WARNED.clear()
    y = tmp_path / "c.yaml"
    y.write_text("staged: false\n")
    ns, _ = _flags(["--replayssm-staged", "false"])
    with caplog.at_level("WARNING", logger="sglang_replayssm"):
        spelled = {
            "env": from_env({"SGLANG_REPLAYSSM_STAGED": "0"}),
            "yaml": from_env({CONFIG_FILE_ENV: str(y)}),
            "flag": from_flags(ns, {}),
            "replace": ReplaySSMConfig().replace(staged=False),
        }
        from_env({"SGLANG_REPLAYSSM_STAGED": "0"})  # a second use of one spelling: no second line
    for how, cfg in spelled.items():
        assert cfg.replay_ring is False and "replay_ring" in cfg.source, how
        assert "staged" not in cfg.to_env() and cfg.to_env()["SGLANG_REPLAYSSM_REPLAY_RING"] == "0"
    lines = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert lines == [f"sglang_replayssm: {old} is deprecated and will be removed in the next release; use {new}"
                     for old, new in (("SGLANG_REPLAYSSM_STAGED", "SGLANG_REPLAYSSM_REPLAY_RING"),
                                      ("staged", "replay_ring"),  # the YAML key and the replace() keyword
                                      ("--replayssm-staged", "--replayssm-replay-ring"))]
    assert from_env({"SGLANG_REPLAYSSM_STAGED": "1", "SGLANG_REPLAYSSM_REPLAY_RING": "true"}).replay_ring is True
    with pytest.raises(ConfigError, match="SGLANG_REPLAYSSM_STAGED .deprecated. and SGLANG_REPLAYSSM_REPLAY_RING "
                                          "disagree.*set only SGLANG_REPLAYSSM_REPLAY_RING"):
        from_env({"SGLANG_REPLAYSSM_STAGED": "0", "SGLANG_REPLAYSSM_REPLAY_RING": "1"})
    with pytest.raises(ConfigError, match="SGLANG_REPLAYSSM_STAGED='maybe' is not a boolean"):
        from_env({"SGLANG_REPLAYSSM_STAGED": "maybe"})
    with caplog.at_level("WARNING", logger="sglang_replayssm"):
        assert ReplaySSMConfig(replay_ring=False).staged is False  # the old attribute, read-only
    assert "ReplaySSMConfig.staged is deprecated" in caplog.text


def test_old_patch_list_names_are_deprecated_aliases(caplog):
    from sglang_replayssm import patches

    patches._WARNED.clear()
    with caplog.at_level("WARNING", logger="sglang_replayssm"):
        for _ in range(2):
            assert patches.all_patches() == patches.launch_check_patches()
            assert patches.staged_patches() == patches.replay_ring_patches()
    lines = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert lines == ["sglang_replayssm.patches.all_patches() is deprecated and will be removed in the next release; "
                     "use launch_check_patches()",
                     "sglang_replayssm.patches.staged_patches() is deprecated and will be removed in the next "
                     "release; use replay_ring_patches()"]
    assert not {p.target for p in patches.replay_ring_patches()} & {p.target for p in patches.launch_check_patches()}
