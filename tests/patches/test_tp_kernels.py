"""The replay kernels at the per-rank geometry of tensor parallelism (TP = 2 and 4), in Triton's interpreter.

Under SGLang's TP every rank holds a shard of the SSM heads (``Mamba2StateShape.create(tp_world_size=tp)``:
``H/tp`` heads; Mamba2 groups widened to ``tp`` and replicated when ``n_groups`` does not divide; GDN
``Hk/tp`` key and ``HV/tp`` value heads).  The geometries here are built that way, through SGLang's own
shape class and ``patches/pool.plan_ring``, at odd per-rank head counts (Mamba2 H=3 with G=1, GDN HV=3 /
HK=1), and the kernels run through the packaged launch config (``kernels/configs/default.yaml``).

The oracle is the unsharded problem: the SSM heads are independent, so each rank's decode outputs,
checkpoint and ring entries over several steps (a flush included), and its fold of the ring into the
checkpoint, must equal the rank's slice of the TP=1 run; each rank also matches the PyTorch reference.
A spy on ``launch_config`` checks that the kernels key their launch parameters by the rank's geometry.
"""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.config import ReplaySSMConfig
from sglang_replayssm.kernels import gdn_replay, mamba2_replay
from sglang_replayssm.kernels.gdn_ref import gdn_replay_decode_ref
from sglang_replayssm.kernels.materialize import gdn_materialize, mamba2_materialize
from sglang_replayssm.kernels.mamba2_ref import mamba2_replay_decode_ref
from sglang_replayssm.patches.pool import plan_ring
from sglang_replayssm.ring import GDNRingGeometry, Mamba2RingGeometry

F32 = torch.float32
L = 4                     # ring length: steps 0..3 of a slot, the 4th is a flush
SLOTS = [1, 3, 2]         # live rows (slot 0 is SGLang's dummy slot)
NSLOTS = 4
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(autouse=True)
def _packaged_config(monkeypatch):
    """The packaged launch configs only (no file named by the caller's environment)."""
    monkeypatch.delenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", raising=False)


def _params(shape, act=F32):
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType

    return Mamba2CacheParams(shape=shape, layers=[0], dtype=Mamba2StateDType(conv=act, temporal=F32))


def _geometry_key(keys) -> str:
    """The plain geometry key of a launch-config lookup (config_keys: <key>_S<dtype>, <key>, default_S<dtype>)."""
    return keys[1] if len(keys) > 1 else keys[0]


def _spy_keys(monkeypatch, module):
    seen = []
    real = module.launch_config

    def spy(family, key, *a, **k):
        seen.append((family, key if isinstance(key, str) else tuple(key)))
        return real(family, key, *a, **k)

    monkeypatch.setattr(module, "launch_config", spy)
    if hasattr(module, "_CFG_CACHE"):
        monkeypatch.setattr(module, "_CFG_CACHE", {})
    return seen


def _advance(wp, slots):
    for s in slots:
        wp[s] = (int(wp[s]) + 1) % L


# --------------------------------------------------------------------------------------
# Mamba2: per rank H = 3, G = 1
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("tp,n_groups", [(2, 1), (4, 1), (4, 4)])
def test_tp_mamba2_kernels_at_per_rank_odd_heads_equal_the_unsharded_run(tp, n_groups, monkeypatch):
    from sglang.srt.configs.mamba_utils import Mamba2StateShape

    Hr, P, N = 3, 16, 16
    H = Hr * tp
    shape = Mamba2StateShape.create(tp_world_size=tp, intermediate_size=H * P, n_groups=n_groups, num_heads=H,
                                    head_dim=P, state_size=N, conv_kernel=4)
    plan = plan_ring(_params(shape), ReplaySSMConfig(enable=True, buffer_len=L), model_config=None)
    assert plan.kind == "mamba2"
    # (no ModelConfig published: bf16 activations assumed for the ring; the kernels run fp32 here for tight checks)
    assert plan.geom == Mamba2RingGeometry(nheads=Hr, head_dim=P, dstate=N, ngroups=1, buffer_len=L,
                                           act_dtype=torch.bfloat16)
    G = n_groups  # unsharded groups; a rank holds group r * n_groups // tp (n_groups 1: the one group, replicated)

    gen = torch.Generator().manual_seed(100 + tp * 10 + n_groups)
    rnd = lambda *s, sc=1.0: torch.randn(*s, generator=gen) * sc  # noqa: E731
    full = dict(state=rnd(NSLOTS, H, P, N, sc=0.5), x=torch.zeros(NSLOTS, H, L, P), B=torch.zeros(NSLOTS, G, L, N),
                dt=torch.zeros(NSLOTS, H, L))
    A = -(torch.rand(H, generator=gen) + 0.3)
    D, dt_bias = rnd(H, sc=0.5), rnd(H, sc=0.5)
    wp_full = torch.zeros(NSLOTS, dtype=torch.int32)

    def rank_view(r):
        hs = slice(r * Hr, (r + 1) * Hr)
        g = r * G // tp
        return hs, slice(g, g + 1)

    ranks = []
    for r in range(tp):
        hs, gs = rank_view(r)
        ranks.append(dict(state=full["state"][:, hs].clone(), x=full["x"][:, hs].clone(),
                          B=full["B"][:, gs].clone(), dt=full["dt"][:, hs].clone(),
                          wp=torch.zeros(NSLOTS, dtype=torch.int32)))
    keys = _spy_keys(monkeypatch, mamba2_replay)
    idx = torch.tensor(SLOTS, dtype=torch.int32)
    b = len(SLOTS)
    for step in range(L + 2):  # past one flush, then two more ring entries
        x, dt, z = rnd(b, H, P), rnd(b, H), rnd(b, H, P)
        Bm, Cm = rnd(b, G, N), rnd(b, G, N)
        out_full = mamba2_replay.mamba2_replay_decode(
            full["state"], full["x"], full["B"], full["dt"], x, dt, A, Bm, Cm, idx, wp_full[idx],
            D=D, z=z, dt_bias=dt_bias)
        for r, rk in enumerate(ranks):
            hs, gs = rank_view(r)
            args = (x[:, hs].contiguous(), dt[:, hs].contiguous(), A[hs].contiguous(), Bm[:, gs].contiguous(),
                    Cm[:, gs].contiguous(), idx, rk["wp"][idx])
            kw = dict(D=D[hs].contiguous(), z=z[:, hs].contiguous(), dt_bias=dt_bias[hs].contiguous())
            ref_state, ref_x, ref_B, ref_dt = (rk[n].clone() for n in ("state", "x", "B", "dt"))
            ref = mamba2_replay_decode_ref(ref_state, ref_x, ref_B, ref_dt, *args, **kw)
            out = mamba2_replay.mamba2_replay_decode(rk["state"], rk["x"], rk["B"], rk["dt"], *args, **kw)
            torch.testing.assert_close(out, out_full[:, hs], **TOL, msg=f"tp {tp} rank {r} step {step}: output")
            torch.testing.assert_close(out, ref, **TOL, msg=f"tp {tp} rank {r} step {step}: vs reference")
            torch.testing.assert_close(rk["state"], ref_state, **TOL)
            _advance(rk["wp"], SLOTS)
        _advance(wp_full, SLOTS)
    for r, rk in enumerate(ranks):  # checkpoints (one flush per slot) and ring entries are the rank's slices
        hs, gs = rank_view(r)
        torch.testing.assert_close(rk["state"], full["state"][:, hs], **TOL)
        torch.testing.assert_close(rk["x"], full["x"][:, hs], rtol=0, atol=0)
        torch.testing.assert_close(rk["dt"], full["dt"][:, hs], rtol=0, atol=0)
        torch.testing.assert_close(rk["B"], full["B"][:, gs], rtol=0, atol=0)
        assert torch.equal(rk["wp"], wp_full) and int(wp_full[SLOTS[0]]) == 2  # entries pending for the fold
    # the fold (radix donation, retract): each rank folds its own ring into its own checkpoint
    mamba2_materialize(full["state"], full["x"], full["B"], full["dt"], A, wp_full, SLOTS)
    for r, rk in enumerate(ranks):
        hs, _ = rank_view(r)
        mamba2_materialize(rk["state"], rk["x"], rk["B"], rk["dt"], A[hs].contiguous(), rk["wp"], SLOTS)
        torch.testing.assert_close(rk["state"], full["state"][:, hs], **TOL, msg=f"tp {tp} rank {r}: fold")
        assert not rk["wp"].any()
    per_rank_key = mamba2_replay.geometry_key(Hr, P, N, 1, L)
    assert {_geometry_key(k[1]) for k in keys
            if _geometry_key(k[1]) != mamba2_replay.geometry_key(H, P, N, G, L)} == {per_rank_key}


# --------------------------------------------------------------------------------------
# GDN: per rank HV = 3, HK = 1
# --------------------------------------------------------------------------------------

def _rank_qkv(mixed, r, Hk, HV, K, V, tp):
    """Rank r's packed [q, k, v] columns: SGLang shards q, k and v independently (conv_shard_groups)."""
    kr, vr = Hk // tp, HV // tp
    q = mixed[:, r * kr * K:(r + 1) * kr * K]
    k = mixed[:, Hk * K + r * kr * K:Hk * K + (r + 1) * kr * K]
    v = mixed[:, 2 * Hk * K + r * vr * V:2 * Hk * K + (r + 1) * vr * V]
    return torch.cat([q, k, v], dim=1).contiguous()


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_gdn_kernels_at_per_rank_odd_heads_equal_the_unsharded_run(tp, monkeypatch):
    from sglang.srt.configs.mamba_utils import Mamba2StateShape

    Hkr, HVr, K, V = 1, 3, 16, 16
    Hk, HV = Hkr * tp, HVr * tp
    shape = Mamba2StateShape.create(tp_world_size=tp, intermediate_size=HV * V, n_groups=Hk, num_heads=HV,
                                    head_dim=V, state_size=K, conv_kernel=4,
                                    conv_shard_groups=[Hk * K, Hk * K, HV * V])
    plan = plan_ring(_params(shape), ReplaySSMConfig(enable=True, buffer_len=L), model_config=None)
    assert plan.kind == "gdn" and shape.num_k_heads_per_tp == Hkr
    assert plan.geom == GDNRingGeometry(num_k_heads=Hkr, num_v_heads=HVr, head_k_dim=K, head_v_dim=V, buffer_len=L,
                                        act_dtype=torch.bfloat16, state_dtype=F32)

    gen = torch.Generator().manual_seed(200 + tp)
    rnd = lambda *s, sc=1.0: torch.randn(*s, generator=gen) * sc  # noqa: E731
    full = dict(state=rnd(NSLOTS, HV, V, K, sc=0.3), d=torch.zeros(NSLOTS, HV, L, V), k=torch.zeros(NSLOTS, Hk, L, K),
                g=torch.zeros(NSLOTS, HV, L))
    A_log, dt_bias = torch.log(torch.rand(HV, generator=gen) * 8 + 1), rnd(HV, sc=0.5)
    wp_full = torch.zeros(NSLOTS, dtype=torch.int32)
    vs = lambda r: slice(r * HVr, (r + 1) * HVr)  # noqa: E731
    ks = lambda r: slice(r * Hkr, (r + 1) * Hkr)  # noqa: E731
    ranks = [dict(state=full["state"][:, vs(r)].clone(), d=full["d"][:, vs(r)].clone(), k=full["k"][:, ks(r)].clone(),
                  g=full["g"][:, vs(r)].clone(), wp=torch.zeros(NSLOTS, dtype=torch.int32)) for r in range(tp)]
    keys = _spy_keys(monkeypatch, gdn_replay)
    idx = torch.tensor(SLOTS, dtype=torch.int32)
    b = len(SLOTS)
    for step in range(L + 2):
        mixed, a, bb = rnd(b, 2 * Hk * K + HV * V), rnd(b, HV), rnd(b, HV)
        out_full = gdn_replay.gdn_replay_decode(mixed, a, bb, A_log, dt_bias, full["state"], full["d"], full["k"],
                                                full["g"], idx, wp_full[idx])
        for r, rk in enumerate(ranks):
            args = (_rank_qkv(mixed, r, Hk, HV, K, V, tp), a[:, vs(r)].contiguous(), bb[:, vs(r)].contiguous(),
                    A_log[vs(r)].contiguous(), dt_bias[vs(r)].contiguous())
            ref_pools = [rk[n].clone() for n in ("state", "d", "k", "g")]
            ref = gdn_replay_decode_ref(*args, *ref_pools, idx, rk["wp"][idx])
            out = gdn_replay.gdn_replay_decode(*args, rk["state"], rk["d"], rk["k"], rk["g"], idx, rk["wp"][idx])
            torch.testing.assert_close(out, out_full[:, vs(r)], **TOL, msg=f"tp {tp} rank {r} step {step}: output")
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=2e-6, msg=f"tp {tp} rank {r} step {step}: vs ref")
            torch.testing.assert_close(rk["state"], ref_pools[0], rtol=1e-5, atol=1e-5)
            _advance(rk["wp"], SLOTS)
        _advance(wp_full, SLOTS)
    for r, rk in enumerate(ranks):
        torch.testing.assert_close(rk["state"], full["state"][:, vs(r)], **TOL)
        torch.testing.assert_close(rk["d"], full["d"][:, vs(r)], **TOL)
        torch.testing.assert_close(rk["k"], full["k"][:, ks(r)], rtol=0, atol=0)  # raw k: exactly the input
        torch.testing.assert_close(rk["g"], full["g"][:, vs(r)], **TOL)
        assert torch.equal(rk["wp"], wp_full)
    gdn_materialize(full["state"], full["d"], full["k"], full["g"], wp_full, SLOTS)
    for r, rk in enumerate(ranks):
        gdn_materialize(rk["state"], rk["d"], rk["k"], rk["g"], rk["wp"], SLOTS)
        torch.testing.assert_close(rk["state"], full["state"][:, vs(r)], rtol=1e-5, atol=1e-5,
                                   msg=f"tp {tp} rank {r}: fold")
        assert not rk["wp"].any()
    per_rank = f"HV{HVr}_HK{Hkr}_K{K}_V{V}_L{L}"
    assert {_geometry_key(k[1]) for k in keys} == {per_rank, f"HV{HV}_HK{Hk}_K{K}_V{V}_L{L}"}
