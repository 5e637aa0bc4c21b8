"""The package never says "OK" when it is not: the launcher, plugin, enable() and doctor refuse, in one
line, what would otherwise serve stock SGLang as patched or fail late (issue 22, items 2-8)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_replayssm.config import (
    ENABLE_ENV, ConfigError, enable_requested, flags_help, from_env, launcher_flags, unknown_flag_error,
)
from sglang_replayssm.launch_server import (
    PROG, _own_parser, cuda_problem, kernel_config_problem, plugins_allowlist_problem,
)
from sglang_replayssm.patches import active_patches
from sglang_replayssm.patches.registry import (
    SGLANG_MISSING, Patch, PatchError, require_applicable, supported_range, version_matches,
)

from ._sglang_cpu import ROOT, clean_env, last_json, run_py

LAUNCH = ["-m", "sglang_replayssm.launch_server"]
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}  # torch sees no CUDA device here and on a GPU host alike


def run(args, env=None, timeout=300):
    return subprocess.run([sys.executable, *args], env=env or clean_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def one_error_line(r) -> str:
    """The launcher's stderr must be exactly one ``prog: error:`` line (no usage block, no traceback)."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith(f"{PROG}: error: "), r.stderr[-3000:]
    return lines[0]


# a process that reports SGLang as `version` (None: not installed) before running `body`
FAKE_SGLANG = r"""
import importlib.metadata as md
_real = md.version
_V = {version!r}
def _fake(dist):
    if dist == "sglang":
        if _V is None:
            raise md.PackageNotFoundError(dist)
        return _V
    return _real(dist)
md.version = _fake
{body}
"""


def fake_sglang(version, body, env=None):
    return run_py(FAKE_SGLANG.format(version=version, body=body), env=env or clean_env())


# ---- item 2: nothing applicable is an error, never "N patch(es) verified" / "OK" ----

def test_supported_range_is_the_union_of_the_declared_ranges():
    assert supported_range(active_patches(True)) == ">=0.5.15,<0.6"
    hook = lambda r, *a, **k: None  # noqa: E731
    joined = [Patch("m.a", "after", hook, versions=">=0.5.15,<0.5.17"), Patch("m.b", "after", hook, versions=">=0.5.17,<0.6")]
    assert supported_range(joined) == ">=0.5.15,<0.6"
    gap = [Patch("m.a", "after", hook, versions=">=0.5.15,<0.5.16"), Patch("m.b", "after", hook, versions=">=0.5.17,<0.6")]
    assert supported_range(gap) == ">=0.5.15,<0.5.16 or >=0.5.17,<0.6"
    odd = [Patch("m.a", "after", hook, versions="==0.5.23"), Patch("m.b", "after", hook, versions=">=0.5.15,<0.6")]
    assert set(supported_range(odd).split(" or ")) == {">=0.5.15,<0.6", "==0.5.23"}  # not joinable: each spec


@pytest.mark.parametrize("version,needle", [
    ("0.4.9", "SGLang 0.4.9 is installed but sglang_replayssm supports SGLang 0.5.15, 0.5.17 and 0.5.23"),
    ("0.6.1", "SGLang 0.6.1 is installed"),
    ("0.5.17rc1", "SGLang 0.5.17rc1 is installed"),
    (SGLANG_MISSING, "SGLang is not installed; sglang_replayssm patches SGLang 0.5.15, 0.5.17 and 0.5.23"),
])
def test_require_applicable_names_version_and_range(version, needle):
    with pytest.raises(PatchError) as e:
        require_applicable(active_patches(True), version)
    assert needle in str(e.value)
    assert len(require_applicable(active_patches(True), "0.5.17")) > 0


def test_version_matches_is_pep440():
    assert version_matches("0.5.17", ">=0.5.15,<0.6") and version_matches("0.5.17+cu128", ">=0.5.15,<0.6")
    assert not version_matches("0.5.15rc1", ">=0.5.15,<0.6")      # not the release the patches were checked on
    assert not version_matches("0.5.18.dev0", ">=0.5.15,<0.6")    # pre-releases only where the spec names one
    assert version_matches("0.5.16rc1", ">=0.5.16rc1,<0.6")
    assert not version_matches(SGLANG_MISSING, ">=0.5.15,<0.6")
    with pytest.raises(ValueError, match="bad version spec"):
        version_matches("0.5.17", ">>0.5")


PLUGIN_ENABLED = """
import os
os.environ["SGLANG_REPLAYSSM_ENABLE"] = "1"
from sglang_replayssm.plugin import register
register()
print("REGISTERED")
"""


@pytest.mark.parametrize("version", ["0.4.9", None])
def test_plugin_refuses_unsupported_or_missing_sglang(version):
    r = fake_sglang(version, PLUGIN_ENABLED)
    assert r.returncode != 0 and "REGISTERED" not in r.stdout
    assert "patch(es) verified" not in r.stderr
    want = "SGLang 0.4.9 is installed" if version else "SGLang is not installed"
    assert want in r.stderr and ">=0.5.15,<0.6" in r.stderr


def test_enable_refuses_unsupported_sglang_and_restores_env():
    body = """
import os, sglang_replayssm
try:
    sglang_replayssm.enable(buffer_len=4)
    print("ENABLED")
except Exception as e:
    print("ERROR", type(e).__name__, e)
print("LEFT", sorted(k for k in os.environ if k.startswith("SGLANG_REPLAYSSM_")))
"""
    r = fake_sglang("0.6.0", body)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ENABLED" not in r.stdout and "ERROR PatchError SGLang 0.6.0 is installed" in r.stdout
    assert ">=0.5.15,<0.6" in r.stdout and "LEFT []" in r.stdout


DOCTOR = "from sglang_replayssm.cli import main\nraise SystemExit(main(['doctor']))"


def test_doctor_fails_for_unsupported_sglang():
    r = fake_sglang("0.6.0", DOCTOR)
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    assert "error: SGLang 0.6.0 is installed but sglang_replayssm supports SGLang 0.5.15, 0.5.17 and 0.5.23" in r.stdout
    assert ">=0.5.15,<0.6" in r.stdout
    assert "status: PROBLEMS FOUND" in r.stdout and "status: OK" not in r.stdout


def test_doctor_states_missing_sglang_once():
    r = fake_sglang(None, DOCTOR)
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    assert r.stdout.count("SGLang is not installed") == 1, r.stdout
    assert "not for SGLang" not in r.stdout and "status: PROBLEMS FOUND" in r.stdout


def test_launcher_refuses_unsupported_sglang():
    body = """
from sglang_replayssm.launch_server import main
raise SystemExit(main(["--model-path", "x"]))
"""
    r = fake_sglang("0.5.14", body, env=clean_env(**NO_GPU))
    line = one_error_line(r)
    assert "SGLang 0.5.14 is installed" in line and ">=0.5.15,<0.6" in line


# ---- item 3: an SGLANG_PLUGINS allow-list without us ----

PROBE = r"""
import json
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import ServerArgs
print(json.dumps({"patched": getattr(ServerArgs.__dict__["check_server_args"], "__replayssm_patch__", None)}))
"""


def test_sglang_skips_us_under_an_allowlist_and_the_launcher_refuses():
    # why the check exists: SGLang itself loads no ReplaySSM patch when the list leaves us out
    r = run_py(PROBE, env=clean_env(SGLANG_REPLAYSSM_ENABLE="1", SGLANG_PLUGINS="someone_else"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert last_json(r.stdout) == {"patched": None}
    r = run([*LAUNCH, "--model-path", "x"], env=clean_env(SGLANG_PLUGINS="someone_else", **NO_GPU))
    line = one_error_line(r)
    assert "SGLANG_PLUGINS='someone_else'" in line and "add replayssm to SGLANG_PLUGINS or unset it" in line
    # --replayssm-disable is stock SGLang anyway: the allow-list is not ours to judge (ends at the GPU check)
    r = run([*LAUNCH, "--replayssm-disable", "--model-path", "x"], env=clean_env(SGLANG_PLUGINS="someone_else", **NO_GPU))
    assert "SGLANG_PLUGINS" not in one_error_line(r)


def test_allowlist_parsing_matches_sglang():
    assert plugins_allowlist_problem({}) is None
    assert plugins_allowlist_problem({"SGLANG_PLUGINS": ""}) is None
    assert plugins_allowlist_problem({"SGLANG_PLUGINS": " other , replayssm "}) is None
    assert "add replayssm" in plugins_allowlist_problem({"SGLANG_PLUGINS": "other,,replay"})


def test_enable_and_doctor_refuse_an_allowlist_without_us(monkeypatch):
    import sglang_replayssm

    monkeypatch.setenv("SGLANG_PLUGINS", "other")
    with pytest.raises(RuntimeError, match="add replayssm to SGLANG_PLUGINS"):
        sglang_replayssm.enable()
    assert ENABLE_ENV not in os.environ
    r = run(["-m", "sglang_replayssm", "doctor"], env=clean_env(SGLANG_PLUGINS="other"))
    assert r.returncode == 1 and "add replayssm to SGLANG_PLUGINS or unset it" in r.stdout


# ---- item 4: the kernel launch-config file is checked whole, before SGLang starts ----

BAD_VALUE = "gdn_decode:\n  default:\n    num_warps: 3\n"


@pytest.mark.parametrize("text,needles", [
    (None, ["does not exist", "--replayssm-kernel-config"]),
    ("gdn_decode: [1, 2\n", ["not valid YAML"]),
    (BAD_VALUE, ["[gdn_decode]", "num_warps", "3"]),
])
def test_launcher_refuses_a_bad_kernel_config(tmp_path, text, needles):
    f = tmp_path / "k.yaml"
    if text is not None:
        f.write_text(text)
    r = run([*LAUNCH, "--replayssm-kernel-config", str(f), "--model-path", "x"], env=clean_env(**NO_GPU))
    line = one_error_line(r)
    for n in needles:
        assert n in line, line
    if text is not None:
        assert str(f) in line


def test_good_kernel_config_passes_the_launch_check(tmp_path):
    cfg = ROOT / "sglang_replayssm" / "kernels" / "configs" / "h200.yaml"
    assert kernel_config_problem(str(cfg)) is None
    r = run([*LAUNCH, "--replayssm-kernel-config", str(cfg), "--model-path", "x"], env=clean_env(**NO_GPU))
    assert "a CUDA GPU is required" in one_error_line(r)  # the next check: the file itself was accepted


def test_kernel_config_problem_is_one_line(tmp_path):
    f = tmp_path / "k.yaml"
    f.write_text("a: [1,\n  2\nb: {\n")
    msg = kernel_config_problem(str(f))
    assert msg and "\n" not in msg and str(f) in msg
    assert "does not exist" in kernel_config_problem(str(tmp_path / "none.yaml"))
    with pytest.raises(ConfigError, match="SGLANG_REPLAYSSM_KERNEL_CONFIG='nope.yaml': file does not exist"):
        from_env({"SGLANG_REPLAYSSM_KERNEL_CONFIG": "nope.yaml"})


def test_plugin_only_use_refuses_a_bad_kernel_config(tmp_path):
    f = tmp_path / "k.yaml"
    f.write_text("gdn_decode: [1, 2\n")
    r = run_py(PROBE, env=clean_env(SGLANG_REPLAYSSM_ENABLE="1", SGLANG_REPLAYSSM_KERNEL_CONFIG=str(f)))
    assert r.returncode != 0 and "not valid YAML" in r.stderr and "patch(es) verified" not in r.stderr
    code = f"""
import sglang_replayssm
try:
    sglang_replayssm.enable(kernel_config={str(f)!r})
except ValueError as e:
    print("REFUSED", e)
"""
    r = run_py(code)
    assert "REFUSED" in r.stdout and str(f) in r.stdout, r.stdout + r.stderr[-2000:]


def test_doctor_reports_a_bad_kernel_config(tmp_path):
    f = tmp_path / "k.yaml"
    f.write_text("gdn_decode: [1, 2\n")
    r = run(["-m", "sglang_replayssm", "doctor"], env=clean_env(SGLANG_REPLAYSSM_KERNEL_CONFIG=str(f)))
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    assert re.search(r"error: .*not valid YAML", r.stdout) and "PROBLEMS FOUND" in r.stdout


# ---- item 5: an unknown --replayssm-* flag is one line, before anything is imported ----

def test_unknown_flag_is_one_line_with_a_suggestion():
    r = run([*LAUNCH, "--replayssm-bufer-len", "8", "--model-path", "x"])
    line = one_error_line(r)
    assert line.startswith(f"{PROG}: error: unrecognized ReplaySSM flag --replayssm-bufer-len "
                           "(did you mean --replayssm-buffer-len?)")
    assert "patched" not in r.stderr and not r.stdout
    r = run([*LAUNCH, "--replayssm-replay-ring=0", "--replayssm-spec-max-runing=auto"])
    assert "(did you mean --replayssm-spec-max-running?)" in one_error_line(r)
    r = run([*LAUNCH, "--model-path", "x", "--replayssm-buffer-len"])  # a known flag without its value
    assert "--replayssm-buffer-len: expected one argument" in one_error_line(r)


def test_unknown_flag_is_found_before_sglang_is_imported():
    code = ("import sys\nfrom sglang_replayssm.launch_server import main\nrc = main(['--replayssm-x', '1'])\n"
            "print(rc, any(m == 'sglang' or m.startswith(('sglang.', 'torch')) for m in sys.modules))")
    r = run_py(code)
    assert r.stdout.split() == ["2", "False"], r.stdout + r.stderr[-2000:]
    assert unknown_flag_error(["--model-path", "m", "--port", "1"]) is None


# ---- item 6: `flags` prints what the launcher accepts; the plugin is inert unless enabled ----

def test_flags_lists_exactly_the_launcher_flags():
    r = run(["-m", "sglang_replayssm", "flags"])
    assert r.returncode == 0, r.stderr[-2000:]
    listed = set(re.findall(r"^\s+(--replayssm-[a-z-]+)", r.stdout, re.M))
    accepted = {o for a in _own_parser()._actions for o in a.option_strings}
    assert listed == accepted and listed == {f.flag for f in launcher_flags()}
    assert {"--replayssm-disable", "--replayssm-config"} <= listed and "--replayssm-enable" not in listed
    assert flags_help() in r.stdout


def test_enable_flag_points_to_disable():
    r = run([*LAUNCH, "--replayssm-enable", "--model-path", "x"])
    assert "launcher enables ReplaySSM itself; --replayssm-disable turns it off" in one_error_line(r)


def test_enable_requested():
    for v in (None, "", "0", "false", "No", " off "):
        assert not enable_requested({} if v is None else {ENABLE_ENV: v}), v
    for v in ("1", "true", "ture", "maybe"):
        assert enable_requested({ENABLE_ENV: v}), v


def test_bad_setting_warns_when_not_enabled_and_fails_when_enabled():
    r = run_py(PROBE, env=clean_env(SGLANG_REPLAYSSM_BUFFER_LEN="0"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert last_json(r.stdout) == {"patched": None}
    warned = [ln for ln in r.stderr.splitlines() if "SGLANG_REPLAYSSM_BUFFER_LEN" in ln]
    assert len(warned) == 1 and "not enabled" in warned[0] and "ignoring a bad setting" in warned[0]
    r = run_py(PROBE, env=clean_env(SGLANG_REPLAYSSM_ENABLE="0", SGLANG_REPLAYSSM_BUFER_LEN="8"))
    assert r.returncode == 0 and "unknown environment variable" in r.stderr
    r = run_py(PROBE, env=clean_env(SGLANG_REPLAYSSM_ENABLE="ture"))  # a typo of true: asked for, so loud
    assert r.returncode != 0 and "SGLANG_REPLAYSSM_ENABLE='ture' is not a boolean" in r.stderr


# ---- item 7: make venv fetches the wheels; serve cleans up; packaging metadata ----

def test_make_venv_fetches_the_sglang_wheels(tmp_path):
    r = subprocess.run(["make", "-n", "venv", f"WHEEL_CACHE={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    for v in ("0.5.15", "0.5.23"):
        assert f"pip download -q --no-deps -d {tmp_path}/{v} sglang=={v}" in r.stdout, r.stdout


def test_serve_removes_its_model_dir():
    # the launcher child ends at the GPU check here; the built-in model's config dir must go with it
    r = run(["-m", "sglang_replayssm", "serve", "--model", "tiny-qwen3-next", "--port", "1"], env=clean_env(**NO_GPU))
    assert r.returncode == 2 and "a CUDA GPU is required" in r.stderr, r.stdout + r.stderr[-2000:]
    m = re.search(r"--model-path (\S+)", r.stdout)
    assert m and "replayssm-tiny-qwen3-next-" in m.group(1)
    assert not Path(m.group(1)).exists() and not Path(m.group(1)).parent.exists()


def test_license_and_dependencies():
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == {"text": "Apache-2.0"} and "packaging" in meta["dependencies"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and "9. Accepting Warranty or Additional Liability" in text


# ---- item 8: no GPU is one line, unless SGLang is told to serve elsewhere ----

def test_no_gpu_is_one_line():
    r = run([*LAUNCH, "--model-path", "x"], env=clean_env(**NO_GPU))
    assert one_error_line(r).endswith("error: a CUDA GPU is required to serve (torch.cuda.is_available() is False); "
                                      "check the driver / CUDA_VISIBLE_DEVICES, or pass SGLang's --device for "
                                      "another device")
    r = run([*LAUNCH, "--help"], env=clean_env(**NO_GPU))
    assert r.returncode == 0 and "--replayssm-buffer-len" in r.stdout


def test_other_devices_are_left_to_sglang(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_problem(["--device", "cpu"], {}) is None
    assert cuda_problem(["--device=xpu"], {}) is None
    assert cuda_problem([], {"SGLANG_USE_CPU_ENGINE": "1"}) is None
    assert "CUDA GPU is required" in cuda_problem(["--device", "cuda"], {})
    assert "CUDA GPU is required" in cuda_problem(["--model-path", "m"], {})
