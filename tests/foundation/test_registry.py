"""The patch registry against real SGLang classes (imported on CPU): the venv's 0.5.17, or another tested
release first on PYTHONPATH (``make test-sglang-0.5.23``)."""

import sys
import types

import pytest

from sglang_replayssm.patches import launch_check_patches
from sglang_replayssm.patches.registry import (
    MARKER, TESTED_SGLANG, Patch, PatchError, apply, is_patched, resolve, sglang_version, status, unapply_all, verify,
    version_matches,
)

TARGET = "sglang.srt.server_args.ServerArgs.check_server_args"


@pytest.fixture(autouse=True)
def _clean():
    unapply_all()
    yield
    unapply_all()


def test_every_registered_target_resolves_in_installed_sglang():
    assert sglang_version().startswith(TESTED_SGLANG)
    rows = status(launch_check_patches())
    assert rows, "registry is empty"
    for target, state, detail in rows:
        assert state == "resolved", (target, state, detail)


def test_apply_verify_idempotent_and_keeps_wrapped():
    from sglang.srt.server_args import ServerArgs

    original = ServerArgs.__dict__["check_server_args"]
    patches = launch_check_patches()
    with pytest.raises(PatchError) as e:
        verify(patches)
    assert TARGET in str(e.value) and sglang_version() in str(e.value)
    assert apply(patches) == [p.target for p in patches] and TARGET in [p.target for p in patches]
    patched = ServerArgs.__dict__["check_server_args"]
    assert patched.__wrapped__ is original and getattr(patched, MARKER) == TARGET
    assert apply(patches) == []  # idempotent: no double wrapping
    assert ServerArgs.__dict__["check_server_args"] is patched
    verify(patches)
    assert [s for _, s, _ in status(patches)] == ["patched"] * len(patches)
    unapply_all()
    assert ServerArgs.__dict__["check_server_args"] is original


def test_missing_target_names_target_and_version_and_rolls_back():
    from sglang.srt.server_args import ServerArgs

    original = ServerArgs.__dict__["check_server_args"]
    good = launch_check_patches()
    bad = Patch("sglang.srt.server_args.ServerArgs.no_such_method", "after", lambda r, *a, **k: None)
    with pytest.raises(PatchError) as e:
        apply(good + [bad])
    msg = str(e.value)
    assert "sglang.srt.server_args.ServerArgs.no_such_method" in msg and sglang_version() in msg
    assert ServerArgs.__dict__["check_server_args"] is original, "half-patched after a failure"
    rows = dict((t, s) for t, s, _ in status([bad]))
    assert rows[bad.target] == "missing"


def test_missing_module_is_reported():
    bad = Patch("sglang.srt.no_such_module.func", "replace", lambda: None)
    with pytest.raises(PatchError, match="sglang.srt.no_such_module.func"):
        resolve(bad.target)


def test_changed_signature_is_refused():
    bad = Patch(TARGET, "after", lambda r, *a, **k: None, params=("self", "strict"))
    with pytest.raises(PatchError, match="signature changed"):
        apply([bad])
    from sglang.srt.server_args import ServerArgs

    assert not is_patched(ServerArgs.__dict__["check_server_args"], TARGET)


def test_version_gating():
    assert version_matches("0.5.17", ">=0.5.15,<0.6")
    assert not version_matches("0.6.0", ">=0.5.15,<0.6")
    assert not version_matches("0.5.14", ">=0.5.15,<0.6")
    assert version_matches("0.5.23.post1", ">=0.5.23,<0.5.24")
    assert not version_matches("0.5.23.post1", "==0.5.23")  # PEP 440: == is that release only
    assert not version_matches("0.5.15rc1", ">=0.5.15,<0.6")
    p = Patch(TARGET, "after", lambda r, *a, **k: None, versions="==0.5.99")  # not the installed release
    assert apply([p]) == []
    assert status([p])[0][1] == "skipped"


def test_hook_kinds_and_static_and_module_propagation():
    mod = types.ModuleType("replayssm_fake_mod")

    class K:
        @staticmethod
        def s(x):
            return x + 1

        def m(self, x):
            return x * 2

    def f(x):
        return x - 1

    mod.K, mod.f = K, f
    user = types.ModuleType("replayssm_fake_user")
    user.f = f  # a `from replayssm_fake_mod import f` binding
    sys.modules["replayssm_fake_mod"] = mod
    sys.modules["replayssm_fake_user"] = user
    try:
        ps = [
            Patch("replayssm_fake_mod.K.s", "after", lambda r, x: r * 10, versions=">=0"),
            Patch("replayssm_fake_mod.K.m", "before", lambda self, x: ((self, x + 1), {}), versions=">=0"),
            Patch("replayssm_fake_mod.f", "around", lambda orig, x: orig(x) * 100, versions=">=0",
                  propagate=True),
        ]
        apply(ps, version="0.5.17")
        assert isinstance(K.__dict__["s"], staticmethod) and K.s(1) == 20
        assert K().m(1) == 4
        assert mod.f(3) == 200 and user.f(3) == 200
        verify(ps, version="0.5.17")
        unapply_all()
        assert K.s(1) == 2 and K().m(1) == 2 and mod.f(3) == 2 and user.f(3) == 2
    finally:
        sys.modules.pop("replayssm_fake_mod", None)
        sys.modules.pop("replayssm_fake_user", None)
