"""SGLang version policy: exactly the tested releases (0.5.15, 0.5.17, 0.5.23 and their .postN) are served;
every other version -- inside the patches' range or not -- is refused in one line naming them, by the one
function (``registry.require_applicable``) that the launcher, the plugin, ``enable()`` and ``doctor`` share.

Also the second test environment itself (``eval/sglang_versions.py``): the unpacked 0.5.23 wheel really is
what a run with it on ``PYTHONPATH`` imports."""

import json
import os
import subprocess
import sys
import zipfile

import pytest

from sglang_replayssm.patches import active_patches, launch_check_patches
from sglang_replayssm.patches.registry import (
    TESTED_SGLANG, Patch, PatchError, is_tested_release, require_applicable, supported_range,
)

from ._sglang_cpu import ROOT, clean_env
from .test_hardening import NO_GPU, fake_sglang, one_error_line

NAMES = "0.5.15, 0.5.17 and 0.5.23"


@pytest.mark.parametrize("version", ["0.5.15", "0.5.17", "0.5.23", "0.5.17.post1", "0.5.23.post2",
                                     "0.5.17+cu128", "0.5.17.0"])
def test_tested_releases_and_their_post_releases_are_served(version):
    assert is_tested_release(version)
    todo = require_applicable(active_patches(True), version)
    assert todo and all(p.applies_to(version) for p in todo)
    # the launch checks alone (--replayssm-replay-ring false) follow the same policy
    assert require_applicable(active_patches(False), version)


@pytest.mark.parametrize("version", ["0.5.16", "0.5.19", "0.5.22", "0.5.24", "0.5.23.1", "0.6.0", "0.4.9",
                                     "0.5.23rc1", "0.5.18.dev0", "0.5.17.post1.dev0", "weird"])
def test_every_other_version_is_refused_naming_the_tested_releases(version):
    assert not is_tested_release(version)
    with pytest.raises(PatchError) as e:
        require_applicable(active_patches(True), version)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"SGLang {version} is installed" in msg and NAMES in msg and ".postN" in msg
    assert supported_range(active_patches(True)) in msg and "pip install 'sglang==0.5.17'" in msg


def test_tested_list_is_inside_every_declared_range():
    """Each tested release has exactly one patch per target (version-gated entries must not overlap or
    leave a hole), so a refusal is never the only thing between a tested release and a half patch."""
    patches = active_patches(True)
    for v in TESTED_SGLANG:
        todo = require_applicable(patches, v)
        targets = [p.target for p in todo]
        assert len(targets) == len(set(targets)), v
    assert is_tested_release("0.5.15") and TESTED_SGLANG == ("0.5.15", "0.5.17", "0.5.23")


def test_tested_releases_outside_the_patches_range_are_not_offered():
    """The message names only the tested releases some patch applies to (a registry narrowed to 0.5.17+
    offers 0.5.17 and 0.5.23, and refuses 0.5.15)."""
    narrowed = [Patch("m.a", "after", lambda r, *a, **k: None, versions=">=0.5.17,<0.6")]
    with pytest.raises(PatchError, match=r"supports SGLang 0\.5\.17 and 0\.5\.23 \(and their \.postN"):
        require_applicable(narrowed, "0.5.15")
    assert require_applicable(narrowed, "0.5.23.post1") == narrowed
    nothing = [Patch("m.a", "after", lambda r, *a, **k: None, versions=">=0.7,<0.8")]
    with pytest.raises(PatchError, match="no tested release"):
        require_applicable(nothing, "0.7.1")


LAUNCH = """
from sglang_replayssm.launch_server import main
raise SystemExit(main(["--model-path", "x"]))
"""


@pytest.mark.parametrize("version", ["0.5.19", "0.5.23rc1"])
def test_launcher_refuses_an_untested_release_in_one_line(version):
    r = fake_sglang(version, LAUNCH, env=clean_env(**NO_GPU))
    line = one_error_line(r)
    assert f"SGLang {version} is installed" in line and NAMES in line


def test_launcher_passes_the_version_check_on_a_post_release():
    """0.5.17.post1 gets past the SGLang check to the next one (no GPU here)."""
    r = fake_sglang("0.5.17.post1", LAUNCH, env=clean_env(**NO_GPU))
    line = one_error_line(r)
    assert "is installed" not in line and "CUDA" in line


ENABLE = """
import sglang_replayssm
try:
    sglang_replayssm.enable(buffer_len=4)
    print("ENABLED")
except Exception as e:
    print("ERROR", type(e).__name__, e)
"""

DOCTOR = "from sglang_replayssm.cli import main\nraise SystemExit(main(['doctor']))"


def test_enable_and_doctor_refuse_an_untested_release():
    r = fake_sglang("0.5.20", ENABLE)
    assert "ENABLED" not in r.stdout and "ERROR PatchError SGLang 0.5.20 is installed" in r.stdout, r.stdout
    assert NAMES in r.stdout
    r = fake_sglang("0.5.20", DOCTOR)
    assert r.returncode == 1 and f"SGLang 0.5.20 is installed but sglang_replayssm supports SGLang {NAMES}" \
        in r.stdout, r.stdout + r.stderr[-2000:]


# ---- the 0.5.23 test environment (an unpacked wheel first on PYTHONPATH) ----

def test_unpacked_wheel_is_what_python_imports(tmp_path):
    """eval/sglang_versions.py unpacks a release wheel and puts it first on PYTHONPATH: the interpreter then
    imports that release and importlib.metadata reports it (here a stand-in wheel, version 9.9.9)."""
    from eval import sglang_versions as sv

    wheel = tmp_path / "sglang-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("sglang/__init__.py", "MARK = 'unpacked'\n")
        z.writestr("sglang-9.9.9.dist-info/METADATA", "Metadata-Version: 2.1\nName: sglang\nVersion: 9.9.9\n")
    site = sv.unpack(wheel, tmp_path / "site")
    assert sv.unpack(wheel, tmp_path / "site") == site  # done once
    code = ("import importlib.metadata as m, json, sglang\n"
            "print(json.dumps([m.version('sglang'), sglang.__file__, sglang.MARK]))")
    env = dict(os.environ, PYTHONPATH=sv.pythonpath(site))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    ver, path, mark = json.loads(out.stdout.strip().splitlines()[-1])
    assert ver == "9.9.9" and mark == "unpacked" and path.startswith(str(site))


def test_junit_counts(tmp_path):
    """The results file's counts come from pytest's own junit report."""
    from eval import sglang_versions as sv

    xml = tmp_path / "r.xml"
    xml.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest" errors="1" failures="2" '
                   'skipped="3" tests="10" time="1.5"></testsuite></testsuites>')
    assert sv.junit_counts(xml) == {"run": 10, "passed": 4, "failed": 2, "errors": 1, "skipped": 3}


def test_launch_checks_apply_on_every_tested_release():
    """The launch checks (launch_check_patches) are version-independent: one entry per target for each release."""
    for v in TESTED_SGLANG:
        assert len(require_applicable(launch_check_patches(), v)) == len(launch_check_patches())
