"""``pdl`` (programmatic dependent launch) in the verify and decode wrappers: which launches become dependents of
the kernel before them, what each compiled program is told (wait before its first read of that kernel's writes; let
the next launch schedule), and that it stays off where it cannot run. The launches are recorded, not run (the CPU
interpreter has no grid dependency control); the outputs with ``pdl`` on are checked against the oracles by the
launch-variant tests of test_mamba2_verify.py, test_gdn_verify.py, test_mamba2_replay.py and test_gdn_replay.py, on
the GPU with the dependent launches real.
"""

from __future__ import annotations

import pytest
import torch

from eval.verify_sass import capture
from sglang_replayssm.kernels import gdn_verify as gv
from sglang_replayssm.kernels import mamba2_verify as mv

MAMBA2 = {"H": 4, "P": 16, "N": 16, "G": 2}
GDN = {"HV": 4, "Hk": 2, "K": 32, "V": 32}
F32, BF16 = torch.float32, torch.bfloat16


def _mamba2(cfg):
    return capture("mamba2", cfg, MAMBA2, T=3, hist=5, state_dtype=F32, act_dtype=BF16, batch=4)


def _gdn(cfg):
    base = dict(v_loop=2, v_loop_min_batch=1, BV=16)
    return capture("gdn", dict(base, **cfg), GDN, T=3, hist=5, state_dtype=F32, act_dtype=BF16, batch=4)


def _flags(call, *names):
    return tuple(call["kwargs"][n] for n in names) + (call["kwargs"].get("launch_pdl", False),)


@pytest.mark.parametrize("pdl,want", [(1, (True, 1, True)), (0, (True, 0, False))])
def test_mamba2_main_kernel_is_the_bc_pre_kernels_dependent(pdl, want):
    calls = _mamba2({"bc": "pre", "pdl": pdl})
    assert _flags(calls["_mamba2_verify_bc_kernel"], "PDL") == (bool(pdl), False)  # triggers; launched as usual
    # the main kernel keeps the pre-kernel's per-row slot and cursors, waits, is launched as a dependent
    assert _flags(calls["_mamba2_verify_kernel"], "ROW_CUR", "PDL") == want


def test_mamba2_pdl_without_a_pre_kernel_is_a_plain_launch():
    calls = _mamba2({"bc": "inline", "pdl": 1})
    assert "_mamba2_verify_bc_kernel" not in calls
    assert _flags(calls["_mamba2_verify_kernel"], "ROW_CUR", "PDL") == (False, False, False)


@pytest.mark.parametrize("cfg,want", [
    # scores pre-kernel, verify rows' launch, flush rows' launch: each main launch the dependent of the one before
    ({"scores": "pre", "flush_rows": "separate", "pdl": 1}, [(True,), (True, True, True), (True, False, True)]),
    ({"scores": "pre", "flush_rows": "fused", "pdl": 1}, [(True,), (True, False, True)]),
    # scores inline: the first main launch follows no kernel of this verify, the flush rows' launch follows it
    ({"scores": "inline", "flush_rows": "separate", "pdl": 1}, [None, (False, True, False), (True, False, True)]),
    ({"scores": "pre", "flush_rows": "separate", "pdl": 0}, [(False,), (False, False, False), (False, False, False)]),
])
def test_gdn_main_launches_depend_on_the_kernel_before(cfg, want):
    calls = _gdn(cfg)
    scores = calls.get("_gdn_verify_scores_kernel")
    if want[0] is None:
        assert scores is None
    else:
        assert _flags(scores, "PDL")[:1] == want[0] and not scores["kwargs"].get("launch_pdl", False)
    mains = [calls[k] for k in ("_gdn_verify_kernel", "_gdn_verify_kernel#2") if k in calls]
    assert [_flags(c, "PDL", "PDL_NEXT") for c in mains] == want[1:]


def test_pdl_is_off_for_cpu_tensors_and_in_the_interpreter():
    from sglang_replayssm.kernels.common import pdl_on

    assert not pdl_on(True, torch.device("cpu"))
    assert not pdl_on(False, torch.device("cpu"))
    # the wrappers' own decision (capture() builds as on an sm90 GPU; the real pdl_on sees CPU tensors)
    assert mv.pdl_on is pdl_on and gv.pdl_on is pdl_on


# ---- the decode kernels: the main kernel waits first thing, behind the pre-kernel only ----
def _pdl_as_on_sm90(monkeypatch, mod):
    monkeypatch.setattr(mod, "pdl_on", lambda want, dev: bool(want))


@pytest.mark.parametrize("cfg,want", [
    ({"scores": "pre", "pdl": 1}, (True, True)),
    ({"scores": "pre", "pdl": 1, "BKC": 16}, (True, True)),  # the K-chunked kernel
    ({"scores": "pre", "pdl": 1, "flush_first_max_batch": 64}, (True, True)),
    ({"scores": "pre", "pdl": 0}, (False, False)),
    ({"scores": "inline", "pdl": 1}, None),  # no pre-kernel: launched as usual
])
def test_gdn_decode_kernel_is_the_score_pre_kernels_dependent(monkeypatch, cfg, want):
    from eval.gdn_sass import capture as gdn_capture
    from sglang_replayssm.kernels import gdn_replay as gr

    _pdl_as_on_sm90(monkeypatch, gr)
    calls = gdn_capture(cfg, GDN, 8, F32, BF16)
    main = calls.get("_gdn_replay_decode_kchunk_kernel") or calls["_gdn_replay_decode_kernel"]
    if want is None:
        assert "_gdn_history_scores_kernel" not in calls
        assert _flags(main, "PDL") == (False, False)
    else:
        assert _flags(calls["_gdn_history_scores_kernel"], "PDL") == (want[0], False)
        assert _flags(main, "PDL") == want
        assert main["kwargs"]["LATE"] is False  # pdl_wait: start, the built-in default


@pytest.mark.parametrize("cfg,want_ff", [
    ({"pdl": 1, "pdl_wait": "scores"}, False),
    ({"pdl": 1, "pdl_wait": "scores", "BKC": 16}, False),
    ({"pdl": 1, "pdl_wait": "scores", "flush_first_max_batch": 64}, True),
    ({"pdl": 1, "pdl_wait": "scores", "flush_first_max_batch": 64, "BKC": 16}, True),
    ({"pdl": 0, "pdl_wait": "scores", "flush_first_max_batch": 64}, True),  # no pdl: a plain launch, LATE still
])
def test_gdn_decode_late_wait_reads_no_order(monkeypatch, cfg, want_ff):
    """``pdl_wait: scores``: the decode kernel is still the pre-kernel's dependent (with pdl), told to wait late
    (LATE); with flush rows first, its programs find their rows from the write positions (n_rows given), so the
    pre-kernel is told to write no order (its FF 0) and the decode kernel gets none."""
    from eval.gdn_sass import capture as gdn_capture
    from sglang_replayssm.kernels import gdn_replay as gr

    _pdl_as_on_sm90(monkeypatch, gr)
    calls = gdn_capture(dict(cfg, scores="pre"), GDN, 8, F32, BF16, batch=4)
    main = calls.get("_gdn_replay_decode_kchunk_kernel") or calls["_gdn_replay_decode_kernel"]
    pre = calls["_gdn_history_scores_kernel"]
    on = bool(cfg["pdl"])
    assert _flags(pre, "PDL") == (on, False) and _flags(main, "PDL", "LATE") == (on, True, on)
    assert pre["kwargs"]["FF"] == 0 and pre["args"][-2] is None  # the order pointer: none written
    assert (main["kwargs"]["FF"] > 0) == want_ff
    assert main["args"][-1] is None  # no order read
    assert (main["args"][-2] == 4) if want_ff else (main["args"][-2] is None)  # n_rows: the batch


@pytest.mark.parametrize("cfg,batch,want", [
    ({"pdl": 1}, 4, (True, True)),
    ({"pdl": 1, "flush_first_max_batch": 64}, 4, (True, True)),
    ({"pdl": 0}, 4, (False, False)),
    ({"pdl": 1}, 1, None),  # within inline_bc_max_batch: no pre-kernel, launched as usual
])
def test_mamba2_decode_kernel_is_the_bc_pre_kernels_dependent(monkeypatch, tmp_path, cfg, batch, want):
    """With ``pdl`` above inline_bc_max_batch, the decode kernel is launched as the B·C pre-kernel's programmatic
    dependent (grid order or flush rows first); without it, or with B·C inline, it is launched as usual."""
    import yaml

    from eval.gdn_sass import _Recorder
    from sglang_replayssm.kernels import common
    from sglang_replayssm.kernels import mamba2_replay as mr

    f = tmp_path / "cfg.yaml"
    f.write_text(yaml.safe_dump({"mamba2_output_only": {"default": cfg}}))
    monkeypatch.setenv(common.ENV_CONFIG_FILE, str(f))
    _pdl_as_on_sm90(monkeypatch, mr)
    calls = {}
    for n in ("_mamba2_bc_kernel", "_mamba2_replay_kernel"):
        monkeypatch.setattr(mr, n, _Recorder(getattr(mr, n), calls))
    H, P, N, G, L, S = MAMBA2["H"], MAMBA2["P"], MAMBA2["N"], MAMBA2["G"], 8, batch + 2
    r = torch.randn
    mr.mamba2_replay_decode(torch.zeros(S, H, P, N), torch.zeros(S, H, L, P, dtype=BF16),
                            torch.zeros(S, G, L, N, dtype=BF16), torch.zeros(S, H, L), r(batch, H, P).to(BF16),
                            r(batch, H).to(BF16), -torch.rand(H), r(batch, G, N).to(BF16), r(batch, G, N).to(BF16),
                            torch.arange(1, batch + 1, dtype=torch.int32), torch.full((batch,), 3, dtype=torch.int32))
    if want is None:
        assert "_mamba2_bc_kernel" not in calls
        assert _flags(calls["_mamba2_replay_kernel"], "PDL") == (False, False)
    else:
        assert _flags(calls["_mamba2_bc_kernel"], "PDL") == (want[0], False)
        assert _flags(calls["_mamba2_replay_kernel"], "PDL") == want
