"""The entry-point plugin, loaded the way SGLang loads it (sglang.srt.plugins.load_plugins)."""

import re
from importlib.metadata import entry_points
from pathlib import Path

from ._sglang_cpu import clean_env, last_json, run_py

PROBE = r"""
import json
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import ServerArgs
f = ServerArgs.__dict__["check_server_args"]
print(json.dumps({"patched": getattr(f, "__replayssm_patch__", None), "wrapped": hasattr(f, "__wrapped__")}))
"""


def test_entry_point_is_registered():
    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "replayssm"]
    assert len(eps) == 1 and eps[0].value == "sglang_replayssm.plugin:register"
    assert callable(eps[0].load())


def test_plugin_is_inert_when_disabled():
    r = run_py(PROBE, env=clean_env())
    assert r.returncode == 0, r.stderr[-3000:]
    out = last_json(r.stdout)
    assert out == {"patched": None, "wrapped": False}
    assert "sglang_replayssm patched" not in r.stderr


def test_plugin_patches_every_process_when_enabled():
    r = run_py(PROBE, env=clean_env(SGLANG_REPLAYSSM_ENABLE="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    out = last_json(r.stdout)
    assert out["patched"] == "sglang.srt.server_args.ServerArgs.check_server_args" and out["wrapped"]
    assert "sglang_replayssm patched sglang.srt.server_args.ServerArgs.check_server_args" in r.stderr
    assert "kernel config the GPU's packaged file (kernels/configs/<gpu>.yaml)" in r.stderr


def test_plugin_refuses_bad_config_loudly():
    r = run_py(PROBE, env=clean_env(SGLANG_REPLAYSSM_ENABLE="1", SGLANG_REPLAYSSM_BUFFER_LEN="0"))
    assert r.returncode != 0
    assert "SGLANG_REPLAYSSM_BUFFER_LEN" in r.stderr


SEAMS_PROBE = r"""
import json
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang_replayssm.patches import replay_ring_patches
from sglang_replayssm.patches.registry import status
print(json.dumps({t: s for t, s, _ in status(replay_ring_patches())}))
"""


def test_replay_seams_on_by_default_and_off_with_replay_ring_false():
    """Enabled with defaults: every replay-ring seam of this SGLang version is applied and verified in
    the process (those of another version stay skipped); SGLANG_REPLAYSSM_REPLAY_RING=0 leaves them all
    unapplied and applies the launch checks alone."""
    r = run_py(SEAMS_PROBE, env=clean_env(SGLANG_REPLAYSSM_ENABLE="1", SGLANG_REPLAYSSM_REPLAY_RING="0"))
    assert r.returncode == 0, r.stderr[-3000:]
    off = last_json(r.stdout)
    assert off and set(off.values()) <= {"resolved", "skipped"} and "resolved" in off.values()
    assert "--replayssm-replay-ring false: launch checks only" in r.stderr and "deprecated" not in r.stderr
    from sglang_replayssm.patches import launch_check_patches

    assert re.search(rf"replay_ring=False, .*[^0-9]{len(launch_check_patches())} patch\(es\) verified",
                     r.stderr), r.stderr[-2000:]
    cfg = Path(__file__).resolve().parents[2] / "sglang_replayssm" / "kernels" / "configs" / "h200.yaml"
    r = run_py(SEAMS_PROBE, env=clean_env(SGLANG_REPLAYSSM_ENABLE="1", SGLANG_REPLAYSSM_KERNEL_CONFIG=str(cfg)))
    assert r.returncode == 0, r.stderr[-3000:]
    on = last_json(r.stdout)
    assert {t for t, s in on.items() if s == "patched"} == {t for t, s in off.items() if s == "resolved"}
    assert "replay_ring=True" in r.stderr and "launch checks only" not in r.stderr
    assert f"kernel config {cfg}," in r.stderr  # the launch-config file in force is named in every process
