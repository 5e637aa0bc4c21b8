"""The target verify's conv1d seam (patches/conv_verify.py) on SGLang's real ``causal_conv1d_update``.

Applied, verified, idempotent and undone with the ``from ... import`` bindings of SGLang's callers rewritten and
restored; chain target-verify calls go to ``conv1d_verify`` with SGLang's side effects (the conv state and the
windows bit for bit against SGLang's own kernel), everything else to SGLang's; only with ``--replayssm-conv-verify``.
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from seam_env import replayssm_env
from sglang_replayssm.patches import active_patches, apply, conv_verify_patches, unapply_all, verify
from sglang_replayssm.patches import conv_verify as seam

BF16 = torch.bfloat16


def _source():
    return importlib.import_module(seam.TARGET.rsplit(".", 1)[0])


def _case(batch=3, dim=24, T=4, K=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch * T, dim, generator=g).to(BF16).view(batch, T, dim).transpose(1, 2)
    state = torch.randn(batch + 2, dim, K - 1, generator=g).to(BF16)
    w = torch.randn(dim, K, generator=g).to(BF16)
    bias = torch.randn(dim, generator=g).to(BF16)
    phys = torch.zeros(batch + 1, dim, T + K - 2, dtype=BF16)
    s = phys.stride()
    win = phys.as_strided((batch + 1, T, dim, K - 1), (s[0], s[2], s[1], s[2]))
    slots = torch.tensor([3, -1, 1], dtype=torch.int32)[:batch]
    rows = torch.arange(batch, dtype=torch.int32)
    return x, state, w, bias, phys, win, slots, rows


@pytest.fixture
def env(monkeypatch):
    e = replayssm_env(monkeypatch, 16)
    yield e
    unapply_all()


def test_with_the_ring_by_default_or_the_setting(env):
    from sglang_replayssm.config import ConfigError, from_env

    assert from_env().conv_verify is None and from_env().conv_verify_on  # auto: the replay ring is on
    env.setenv("SGLANG_REPLAYSSM_REPLAY_RING", "0")
    assert not from_env().conv_verify_on  # auto without the ring: SGLang's kernel, as in stock
    env.setenv("SGLANG_REPLAYSSM_CONV_VERIFY", "1")
    assert from_env().conv_verify_on
    env.setenv("SGLANG_REPLAYSSM_REPLAY_RING", "1")
    env.setenv("SGLANG_REPLAYSSM_CONV_VERIFY", "off")
    assert not from_env().conv_verify_on
    env.setenv("SGLANG_REPLAYSSM_CONV_VERIFY", "AUTO")
    assert from_env().conv_verify is None
    env.setenv("SGLANG_REPLAYSSM_CONV_VERIFY", "sometimes")
    with pytest.raises(ConfigError, match="CONV_VERIFY.*boolean or auto"):
        from_env()
    assert not any(p.target == seam.TARGET for p in active_patches(True))
    assert [p.target for p in active_patches(False, True) if p.target == seam.TARGET] == [seam.TARGET]


@pytest.mark.parametrize("inherited,ring", [("0", True), ("1", False), (None, False)])
def test_auto_reaches_child_processes_over_inherited_values(tmp_path, inherited, ring):
    """A parent resolved to auto hands ``auto`` on (a child reads the environment and the YAML file again): an
    inherited variable or a YAML value must not decide the child's conv seam differently from the parent's."""
    from sglang_replayssm.config import CONFIG_FILE_ENV, from_env

    yml = tmp_path / "replayssm.yaml"
    yml.write_text("conv_verify: true\n")
    parent_env = {CONFIG_FILE_ENV: str(yml)}
    if inherited is not None:
        parent_env["SGLANG_REPLAYSSM_CONV_VERIFY"] = inherited
    parent = from_env(parent_env).replace(conv_verify="auto", replay_ring=ring)
    assert parent.conv_verify is None and parent.conv_verify_on is ring
    child_env = {**parent_env, **parent.to_env()}  # what the launcher exports before SGLang spawns its processes
    assert child_env["SGLANG_REPLAYSSM_CONV_VERIFY"] == "auto"
    child = from_env(child_env)
    assert child.conv_verify is None and child.conv_verify_on is parent.conv_verify_on


def test_apply_verify_idempotent_rewrites_and_restores_bindings(env):
    src = _source()
    original = src.causal_conv1d_update
    gdn = importlib.import_module("sglang.srt.layers.attention.linear.gdn_backend")  # binds it on every device
    importlib.import_module("sglang.srt.layers.attention.mamba.causal_conv1d")
    callers = [(m, k) for m in list(sys.modules.values()) if m is not None and m is not src
               for k, v in list(getattr(m, "__dict__", {}).items()) if v is original]
    assert (gdn, "causal_conv1d_update") in callers
    patches = conv_verify_patches()
    assert apply(patches) == [seam.TARGET]
    verify(patches)
    wrapped = src.causal_conv1d_update
    assert wrapped is not original and wrapped.__wrapped__ is original
    assert all(getattr(m, k) is wrapped for m, k in callers)
    assert apply(patches) == []  # idempotent
    unapply_all()
    assert src.causal_conv1d_update is original
    assert all(getattr(m, k) is original for m, k in callers)


def test_chain_verify_goes_to_the_kernel_with_sglangs_side_effects(env, monkeypatch):
    src = _source()
    original = src.causal_conv1d_update
    x, state, w, bias, phys, win, slots, rows = _case()
    state0 = state.clone()
    st_stock, phys_stock = state.clone(), phys.clone()
    win_stock = phys_stock.as_strided(win.shape, win.stride())
    original(x, st_stock, w, bias, "silu", conv_state_indices=slots, intermediate_conv_window=win_stock,
             intermediate_state_indices=rows)
    calls = []
    real = seam._kernel()
    monkeypatch.setattr(seam, "_kernel", lambda: (lambda *a, **k: calls.append(1) or real(*a, **k)))
    apply(conv_verify_patches())
    out = src.causal_conv1d_update(x, state, w, bias, "silu", conv_state_indices=slots,
                                   intermediate_conv_window=win, intermediate_state_indices=rows)
    assert calls == [1]
    assert out.shape == x.shape and out.stride() == x.stride()
    assert torch.equal(state, st_stock) and torch.equal(phys, phys_stock)
    from sglang_replayssm.kernels.conv_verify_ref import conv1d_verify_ref

    ref = conv1d_verify_ref(x, state0, w, bias, "silu", conv_state_indices=slots)
    live = [0, 2]
    assert torch.allclose(out[live].float(), ref[live].float(), rtol=2 ** -6, atol=1e-5)


def test_positional_arguments_route_like_keywords(env, monkeypatch):
    src = _source()
    calls = []
    real = seam._kernel()
    monkeypatch.setattr(seam, "_kernel", lambda: (lambda *a, **k: calls.append(1) or real(*a, **k)))
    apply(conv_verify_patches())
    x, state, w, bias, phys, win, slots, rows = _case()
    # x, conv_state, weight, bias, activation, cache_seqlens, conv_state_indices, num_accept_tokens, window, rows
    src.causal_conv1d_update(x, state, w, bias, "silu", None, slots, None, win, rows)
    assert calls == [1]


@pytest.mark.parametrize("kind", ["decode", "tree", "accept", "pad", "validate", "refused"])
def test_other_calls_run_sglangs_code(env, monkeypatch, kind):
    src = _source()
    calls = []
    monkeypatch.setattr(seam, "_kernel", lambda: (lambda *a, **k: calls.append(1)))
    apply(conv_verify_patches())
    x, state, w, bias, phys, win, slots, rows = _case()
    kw = dict(conv_state_indices=slots, intermediate_conv_window=win, intermediate_state_indices=rows)
    if kind == "decode":
        x = x[:, :, :1].contiguous()
        kw = dict(conv_state_indices=slots)
    elif kind == "tree":
        nxt = torch.tensor([[1, 2, 3, -1]] * 3, dtype=torch.int64)
        kw.update(retrieve_next_token=nxt, retrieve_next_sibling=torch.full_like(nxt, -1),
                  retrieve_parent_token=torch.zeros_like(nxt))
    elif kind == "accept":
        kw.update(num_accept_tokens=torch.ones(3, dtype=torch.int32))
    elif kind == "pad":  # another pad slot id (no row padded here: SGLang's kernel would read slot -1)
        kw.update(pad_slot_id=0, conv_state_indices=torch.tensor([3, 2, 1], dtype=torch.int32))
    elif kind == "validate":
        kw.update(validate_data=True)
    else:  # arguments the kernel refuses (int16 slots) and SGLang's kernel takes: SGLang's code, not an error
        kw.update(conv_state_indices=torch.tensor([3, 2, 1], dtype=torch.int16))
    assert seam.not_chain_verify(seam._bind(src.causal_conv1d_update.__wrapped__, (x, state, w, bias, "silu"), kw))
    if kind == "validate":  # SGLang's own checks run (and refuse its own pool layout: it never validates)
        with pytest.raises(AssertionError, match="contiguous along feat-dim"):
            src.causal_conv1d_update(x, state, w, bias, "silu", **kw)
    else:
        src.causal_conv1d_update(x, state, w, bias, "silu", **kw)
    assert calls == []


@pytest.mark.parametrize("version", ["0.5.15", "0.5.23"])
def test_targets_exist_in_other_releases(version):
    from sglang_replayssm.patches.source_check import check

    from sglang_wheels import wheel_for

    assert check(seam.PATCHES, wheel_for(version), version) == []
