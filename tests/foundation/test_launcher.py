"""python -m sglang_replayssm.launch_server and the CLI, run as subprocesses."""

import subprocess
import sys
from importlib.metadata import version

from ._sglang_cpu import ROOT, clean_env, cpu_server_argv


def run(args, env=None, timeout=300):
    return subprocess.run([sys.executable, *args], env=env or clean_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_help_shows_sglang_and_replayssm_flags():
    r = run(["-m", "sglang_replayssm.launch_server", "--help"])
    assert r.returncode == 0, r.stderr[-2000:]
    for flag in ("--model-path", "--speculative-algorithm", "--replayssm-buffer-len", "--replayssm-log-level",
                 "--replayssm-ssm-types", "--replayssm-spec", "--replayssm-config", "--replayssm-disable",
                 "SGLANG_REPLAYSSM_BUFFER_LEN"):
        assert flag in r.stdout, flag
    assert "--stream-interval 8 lifts it (docs/streaming.md)" in " ".join(r.stdout.split())  # the epilog


def test_bad_flag_value_fails_before_sglang_starts():
    r = run(["-m", "sglang_replayssm.launch_server", "--replayssm-log-level", "turbo", "--model-path", "x"])
    assert r.returncode == 2
    assert "--replayssm-log-level" in r.stderr and "warning" in r.stderr


def test_launcher_runs_sglangs_entry_and_rejects_unsupported_combo(tmp_path):
    r = run(["-m", "sglang_replayssm.launch_server", "--replayssm-buffer-len", "8",
             *cpu_server_argv(tmp_path, "--pp-size", "2")])
    assert r.returncode != 0
    assert "UnsupportedConfigError" in r.stderr and "--pp-size 2" in r.stderr
    assert "sglang_replayssm patched sglang.srt.server_args.ServerArgs.check_server_args" in r.stderr
    assert "--stream-interval 1 (SGLang's default)" in r.stderr  # the launcher's streaming note, logged once
    assert r.stderr.count("tokenizer-manager process (one CPU core)") == 1


def test_streaming_note_only_for_per_token_streaming_on_the_ring():
    """The note is advice for a replay-ring server that streams every token: any other interval, the
    launch-checks-only mode and a disabled launcher get none; the flag is never changed."""
    from sglang_replayssm.config import from_env
    from sglang_replayssm.launch_server import streaming_note

    on = from_env({"SGLANG_REPLAYSSM_ENABLE": "true"})
    note = streaming_note(on, ["--model-path", "m"])
    assert note and "--stream-interval 8" in note and "docs/streaming.md" in note
    assert streaming_note(on, ["--stream-interval", "1"]) == note == streaming_note(on, ["--stream-interval=1"])
    for argv in (["--stream-interval", "8"], ["--stream-interval=2"], ["--stream-interval", "1", "--stream-interval=4"]):
        assert streaming_note(on, argv) is None
    assert streaming_note(on, ["--stream-interval", "8", "--stream-interval", "01"]) == note  # the last one counts
    assert streaming_note(on.replace(replay_ring=False), []) is None
    assert streaming_note(from_env({}), []) is None  # not enabled: stock SGLang


def test_doctor_lists_targets_resolved():
    r = run(["-m", "sglang_replayssm", "doctor"])
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "[resolved] sglang.srt.server_args.ServerArgs.check_server_args" in r.stdout
    assert f"sglang                   {version('sglang')}" in r.stdout  # the release this run imports
    assert "[resolved] sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool._init_mamba_pool" in r.stdout
    r = run(["-m", "sglang_replayssm", "doctor", "--apply"], env=clean_env(SGLANG_REPLAYSSM_BUFFER_LEN="4"))
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "[patched ] sglang.srt.server_args.ServerArgs.check_server_args" in r.stdout
    assert "buffer_len       4" in r.stdout
    # the replay-ring seams are part of what a default config applies ...
    assert "[patched ] sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool._init_mamba_pool" in r.stdout
    # so is the conv1d verify seam (conv_verify auto follows the ring)
    assert "[patched ] sglang.kernels.ops.mamba.causal_conv1d_triton.causal_conv1d_update" in r.stdout
    assert "conv_verify      auto (on)" in r.stdout
    # ... and stay unapplied with replay_ring false, where only the launch checks run; the deprecated
    # SGLANG_REPLAYSSM_STAGED still says so for one release, with one deprecation line
    r = run(["-m", "sglang_replayssm", "doctor", "--apply"], env=clean_env(SGLANG_REPLAYSSM_STAGED="0"))
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert [ln for ln in r.stderr.splitlines() if "deprecated" in ln] == [
        "sglang_replayssm: SGLANG_REPLAYSSM_STAGED is deprecated and will be removed in the next release; use "
        "SGLANG_REPLAYSSM_REPLAY_RING"]
    assert "[patched ] sglang.srt.server_args.ServerArgs.check_server_args" in r.stdout
    assert "[resolved] sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool._init_mamba_pool" in r.stdout
    assert "off in this config" in r.stdout
    # the conv1d verify seam: listed always, applied with the ring (auto) or with conv_verify true
    conv = "sglang.kernels.ops.mamba.causal_conv1d_triton.causal_conv1d_update"
    assert f"[resolved] {conv}" in r.stdout and "conv_verify      auto (off)" in r.stdout
    r = run(["-m", "sglang_replayssm", "doctor", "--apply"], env=clean_env(SGLANG_REPLAYSSM_CONV_VERIFY="1"))
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert f"[patched ] {conv}" in r.stdout and "conv_verify      True" in r.stdout


def test_serve_command_for_builtin_model(tmp_path):
    from sglang_replayssm.cli import serve_command

    cmd = serve_command("tiny-nemotron-h", ["--port", "31000"], root=str(tmp_path))
    assert cmd[1:3] == ["-m", "sglang_replayssm.launch_server"]
    assert "--load-format" in cmd and "flashinfer" in cmd and cmd[-2:] == ["--port", "31000"]
    assert cmd[cmd.index("--model-path") + 1].startswith(str(tmp_path))
    assert serve_command("tiny-qwen3-next", [], stock=True, root=str(tmp_path))[2] == "sglang.launch_server"


def test_launcher_default_for_spec_max_running():
    """The launcher sizes max running requests from memory unless SGLang's flag is given; an explicit
    auto next to --max-running-requests is refused."""
    import pytest

    from sglang_replayssm.config import ConfigError, from_env
    from sglang_replayssm.launch_server import resolve_spec_max_running

    base = from_env({})
    assert base.spec_max_running == "sglang"  # plugin-only use keeps SGLang's default
    assert resolve_spec_max_running(base, ["--model-path", "m"]).spec_max_running == "auto"
    for argv in (["--max-running-requests", "64"], ["--max-running-requests=64"]):
        assert resolve_spec_max_running(base, argv).spec_max_running == "sglang"
    chosen = from_env({"SGLANG_REPLAYSSM_SPEC_MAX_RUNNING": "sglang"})
    assert resolve_spec_max_running(chosen, ["--model-path", "m"]).spec_max_running == "sglang"
    auto = from_env({"SGLANG_REPLAYSSM_SPEC_MAX_RUNNING": "auto"})
    with pytest.raises(ConfigError, match="--max-running-requests"):
        resolve_spec_max_running(auto, ["--max-running-requests", "64"])


def test_launcher_exports_spec_max_running(tmp_path):
    r = run(["-m", "sglang_replayssm.launch_server", "--replayssm-spec-max-running", "auto",
             "--max-running-requests", "8", "--model-path", "x"])
    assert r.returncode == 2 and "--max-running-requests" in r.stderr
