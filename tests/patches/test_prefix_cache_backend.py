"""``extra_buffer`` decode tracking through SGLang 0.5.17's real ``Mamba2AttnBackend.forward``, on CPU.

Real: ``MambaMixer2`` layers (conv update + ``selective_state_update`` through SGLang's dispatcher, which
the decode seam routes to ``mamba2_replay_decode`` in Triton's interpreter), ``Mamba2AttnBackend.forward``
with its per-layer track copy (``track_mamba_states_if_needed``, patched by ``patches/prefix_track.py``),
``HybridReqToTokenPool`` with ping-pong track slots.  Stock SGLang (no ring) run on the same schedule is
the reference: every track slot must hold the state stock SGLang tracked there.

The decode seam still refuses a decode forward that carries ``mamba_track_mask``
(``mamba2_decode._plan``); these tests lift that one check by handing ``_plan`` a view of the forward
batch without the mask -- exactly the change the seam needs for standard-decode rings.
"""

import contextlib
import types
import weakref

import pytest
import torch
import triton
import triton.language as tl

from sglang_replayssm.patches import lifecycle, prefix_track
from sglang_replayssm.patches import mamba2_decode as m2d
from sglang_replayssm.patches import pool as pool_seam
from sglang_replayssm.patches.registry import apply, unapply_all
from sglang_replayssm.ring import Mamba2RingGeometry, ReplayRing

from pools import cache_params, hybrid_pool

H, P, N, G, KCONV, HIDDEN = 4, 16, 16, 2, 4, 32
LAYER_IDS = (1, 3)
MAMBA_SIZE = 10
INTERVAL = 3            # a track step every 3 tokens: mid ring cycle and on flush steps for L = 4
TOL = 2e-4


@pytest.fixture(scope="module")
def sgl():
    import sglang.srt.layers.attention.hybrid_linear_attn_backend as hlab
    import sglang.srt.layers.linear as linear
    from sglang.kernels.ops.mamba import causal_conv1d_triton as cct
    from sglang.kernels.ops.mamba.triton_ops import ssu_dispatch
    from sglang.srt.layers.attention.mamba import mamba
    from sglang.srt.layers.attention.mamba.mamba2_metadata import ForwardMetadata, Mamba2Metadata
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.runtime_context import get_parallel

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mamba, "causal_conv1d_update_triton", cct.causal_conv1d_update, raising=False)
        mp.setattr(torch.cpu, "device", lambda index=None: contextlib.nullcontext(), raising=False)
        mp.setattr(linear, "get_tp_group", lambda: types.SimpleNamespace(world_size=1))
        mp.setattr(hlab, "get_memory", lambda: types.SimpleNamespace(enable_page_major_kv_layout=False))
        mp.setattr(ssu_dispatch, "_mamba_ssu_backend", ssu_dispatch.TritonSSUBackend())
        params = cache_params("mamba2", (H, P, N, G), LAYER_IDS, conv_dtype=torch.float32, conv_kernel=KCONV)
        gen = torch.Generator().manual_seed(1234)
        mixers = {}
        with get_parallel().override(tp_size=1, tp_rank=0, attn_tp_size=1, attn_tp_rank=0):
            for lid in LAYER_IDS:
                mx = mamba.MambaMixer2(params, hidden_size=HIDDEN, use_conv_bias=True, use_bias=False,
                                       n_groups=G, prefix=f"layers.{lid}.mixer")
                for p in mx.parameters():
                    p.requires_grad_(False)
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
                mx.A.copy_(-(torch.rand(H, generator=gen) + 0.3))
                mx.dt_bias.copy_(torch.randn(H, generator=gen) * 0.5)
                mixers[lid] = mx
        yield types.SimpleNamespace(hlab=hlab, params=params, mixers=mixers, ForwardMetadata=ForwardMetadata,
                                    Mamba2Metadata=Mamba2Metadata, ForwardMode=ForwardMode)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    unapply_all()
    lifecycle.clear_layer_params()
    yield
    unapply_all()
    lifecycle.clear_layer_params()


class Server:
    """A real pool with ping-pong track slots and a Mamba2 backend; rows = requests (live, ping-pong)."""

    def __init__(self, sgl, ring_len=None, seed=7):
        self.sgl = sgl
        self.pool = hybrid_pool(sgl.params, size=8, mamba_size=MAMBA_SIZE, mamba_spec_state_size=8,
                                enable_mamba_extra_buffer=True, enable_overlap_schedule=True)
        cache = self.pool.mamba_pool.mamba_cache
        gen = torch.Generator().manual_seed(seed)
        cache.temporal.copy_(torch.randn(cache.temporal.shape, generator=gen) * 0.5)
        cache.conv[0].copy_(torch.randn(cache.conv[0].shape, generator=gen) * 0.5)
        b = object.__new__(sgl.hlab.Mamba2AttnBackend)
        b.req_to_token_pool = self.pool
        b.is_draft_worker = False
        b.enable_unified_memory = False
        b.forward_metadata = None
        self.backend = b
        self.ring = None
        if ring_len:
            mp = self.pool.mamba_pool
            self.ring = ReplayRing(Mamba2RingGeometry(H, P, N, G, ring_len, act_dtype=torch.float32),
                                   num_layers=len(LAYER_IDS), num_slots=MAMBA_SIZE + 1)
            setattr(mp, m2d.RING_ATTR, self.ring)
            pool_seam._RINGS[self.ring] = weakref.ref(mp)   # what the pool seam's init hook records

    def forward(self, rows, seq_lens, hs_per_layer):
        """One decode forward; ``rows``: (live slot, track slot) per request; ``seq_lens`` count the
        token decoded now (SGLang's prepare_for_decode)."""
        sgl = self.sgl
        live = torch.tensor([r[0] for r in rows], dtype=torch.int32)
        track = torch.tensor([r[1] for r in rows], dtype=torch.int64)
        mask = torch.tensor([s % INTERVAL == 0 for s in seq_lens])
        fm = sgl.ForwardMetadata(query_start_loc=torch.arange(len(rows) + 1, dtype=torch.int32),
                                 mamba_cache_indices=live, mamba_track_indices=track)
        self.backend.forward_metadata = sgl.Mamba2Metadata.prepare_decode(
            fm, torch.ones(len(rows), dtype=torch.int64), is_target_verify=False, draft_token_num=1)
        fb = types.SimpleNamespace(forward_mode=sgl.ForwardMode.DECODE, mamba_track_mask=mask,
                                   batch_size=len(rows))
        with torch.no_grad():
            return [sgl.hlab.Mamba2AttnBackend.forward(self.backend, sgl.mixers[lid], hs, None, lid, fb,
                                                       use_triton_causal_conv=True)
                    for lid, hs in zip(LAYER_IDS, hs_per_layer)]


def schedule(steps, seed=99):
    """Two requests: A on live slot 2 (track slots 3, 4), B on live slot 5 (track slots 6, 7), with
    prompts of 4 and 2 tokens; B joins one step late.  The track slot alternates (ping-pong)."""
    gen = torch.Generator().manual_seed(seed)
    reqs = {"A": dict(live=2, pp=[3, 4], len=4, nxt=0, start=0), "B": dict(live=5, pp=[6, 7], len=2, nxt=0, start=1)}
    out = []
    for t in range(steps):
        rows, lens = [], []
        for r in reqs.values():
            if t < r["start"]:
                continue
            r["len"] += 1
            rows.append((r["live"], r["pp"][r["nxt"]]))
            lens.append(r["len"])
            if r["len"] % INTERVAL == 0:
                r["nxt"] = 1 - r["nxt"]   # the result processor's swap
        out.append((rows, lens, [torch.randn(len(rows), HIDDEN, generator=gen) for _ in LAYER_IDS]))
    return out


def run(srv, sched):
    tracked = {}
    for rows, lens, hs in sched:
        srv.forward(rows, lens, hs)
        for (live, track), n in zip(rows, lens):
            if n % INTERVAL == 0:
                tracked[(track, n)] = (srv.pool.mamba_pool.mamba_cache.temporal[:, track].clone(),
                                       srv.pool.mamba_pool.mamba_cache.conv[0][:, track].clone())
    return tracked


@pytest.mark.parametrize("L", [4, 2, 1])
def test_track_slots_equal_stock_sglang(sgl, monkeypatch, L):
    """Every state the ring server tracks equals what stock SGLang tracked at the same step (mid ring
    cycle, on flush steps; L = 1: every step a flush), conv windows included, track cursors 0; the
    live slots' rings are left as they were."""
    sched = schedule(10)
    ref = run(Server(sgl), sched)

    apply(m2d.PATCHES + prefix_track.PATCHES)   # the decode seam takes the tracked forward (prefix_track is on)
    srv = Server(sgl, ring_len=L)
    got = run(srv, sched)
    assert set(got) == set(ref) and len(got) >= 6
    phases = set()
    for key, (temporal, conv) in got.items():
        t_ref, c_ref = ref[key]
        err = float((temporal - t_ref).abs().max()) / (float(t_ref.abs().max()) + 1.0)
        assert err < TOL, (key, err)
        assert torch.equal(conv, c_ref), key
        phases.add((key[1] - {3: 4, 4: 4, 6: 2, 7: 2}[key[0]] - 1) % L)   # ring phase before the step
        assert int(srv.ring.write_pos[key[0]]) == 0
    if L > 1:
        assert L - 1 in phases and len(phases) > 1       # flush steps and mid-cycle steps both tracked
    assert int(srv.ring.write_pos[2]) == 10 % L and int(srv.ring.write_pos[5]) == 9 % L   # live rings go on


def test_refused_without_the_track_seam(sgl):
    """Without prefix_track's hooks the decode seam refuses a tracked decode forward (SGLang's copy alone would
    store a checkpoint that lags the ring), and touches no ring cursor."""
    apply(m2d.PATCHES)
    assert not prefix_track.hooks_applied()
    srv = Server(sgl, ring_len=4)
    rows, lens, hs = schedule(1)[0]
    before = srv.ring.write_pos.clone()
    with pytest.raises(m2d.ReplayDecodeError, match="prefix_track seam"):
        srv.forward(rows, lens, hs)
    assert torch.equal(srv.ring.write_pos, before)
    apply(prefix_track.PATCHES)
    assert prefix_track.hooks_applied()


# --------------------------------------------------------------------------------------
# GDN: HybridLinearAttnBackend.forward -> GDNAttnBackend.forward_decode -> packed decode (the ring
# kernel) -> _track_mamba_state_decode -> track_mamba_states_all_layers (patched), once per forward
# --------------------------------------------------------------------------------------

HK, HV, KD, VD = 2, 4, 16, 16
QKV = 2 * HK * KD + HV * VD


@triton.jit
def _interp_exp(x):   # SGLang's fused_recurrent uses a libdevice exp the CPU interpreter lacks
    return tl.exp(x)


@pytest.fixture(scope="module")
def gdn_sgl():
    import sglang.srt.layers.attention.hybrid_linear_attn_backend as hlab
    import sglang.srt.layers.attention.linear.gdn_backend as gb
    from sglang.kernels.ops.attention.fla import fused_recurrent
    from sglang.srt.layers.attention.linear.utils import LinearAttnKernelBackend
    from sglang.srt.layers.attention.mamba.mamba2_metadata import ForwardMetadata
    from sglang.srt.layers.radix_linear_attention import RadixLinearAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    params = cache_params("gdn", (HK, HV, KD, VD), LAYER_IDS, conv_dtype=torch.float32, conv_kernel=KCONV)
    gen = torch.Generator().manual_seed(4321)
    layers = {}
    for lid in LAYER_IDS:
        layers[lid] = RadixLinearAttention(
            lid, num_q_heads=HK, num_k_heads=HK, num_v_heads=HV, head_q_dim=KD, head_k_dim=KD, head_v_dim=VD,
            conv_weights=torch.randn(QKV, KCONV, generator=gen) * 0.4, bias=torch.randn(QKV, generator=gen) * 0.1,
            activation="silu", A_log=torch.randn(HV, generator=gen) * 0.5, dt_bias=torch.randn(HV, generator=gen) * 0.5)
    triton_backend = LinearAttnKernelBackend.TRITON
    mp = pytest.MonkeyPatch()
    mp.setattr(fused_recurrent, "exp", _interp_exp)
    yield types.SimpleNamespace(hlab=hlab, gb=gb, params=params, layers=layers, ForwardMetadata=ForwardMetadata,
                                ForwardMode=ForwardMode,
                                dispatcher=lambda: gb.GDNKernelDispatcher(triton_backend, triton_backend))
    mp.undo()


class GDNServer:
    def __init__(self, sgl, ring_len=None, seed=7):
        from sglang_replayssm.patches import gdn_decode
        from sglang_replayssm.ring import GDNRingGeometry

        self.sgl = sgl
        self.pool = hybrid_pool(sgl.params, size=8, mamba_size=MAMBA_SIZE, mamba_spec_state_size=8,
                                enable_mamba_extra_buffer=True, enable_overlap_schedule=True)
        gen = torch.Generator().manual_seed(seed)
        cache = self.pool.mamba_pool.mamba_cache
        cache.temporal.copy_(torch.randn(cache.temporal.shape, generator=gen) * 0.3)
        cache.conv[0].copy_(torch.randn(cache.conv[0].shape, generator=gen) * 0.5)
        b = object.__new__(sgl.gb.GDNAttnBackend)
        b.req_to_token_pool = self.pool
        b.is_draft_worker = False
        b.enable_unified_memory = False
        b.forward_metadata = None
        b.kernel_dispatcher = sgl.dispatcher()
        hy = object.__new__(sgl.hlab.HybridLinearAttnBackend)
        hy.full_attn_layers = [0, 2]
        hy.linear_attn_backend = b
        hy.full_attn_backend = None
        self.backend, self.hybrid = b, hy
        self.ring = None
        if ring_len:
            mp = self.pool.mamba_pool
            self.ring = ReplayRing(GDNRingGeometry(HK, HV, KD, VD, ring_len, act_dtype=torch.float32,
                                                   state_dtype=torch.float32),
                                   num_layers=len(LAYER_IDS), num_slots=MAMBA_SIZE + 1)
            setattr(mp, gdn_decode.RING_ATTR, self.ring)
            pool_seam._RINGS[self.ring] = weakref.ref(mp)

    def forward(self, rows, seq_lens, inputs):
        sgl = self.sgl
        live = torch.tensor([r[0] for r in rows], dtype=torch.int32)
        track = torch.tensor([r[1] for r in rows], dtype=torch.int64)
        mask = torch.tensor([s % INTERVAL == 0 for s in seq_lens])
        self.backend.forward_metadata = sgl.ForwardMetadata(
            query_start_loc=torch.arange(len(rows) + 1, dtype=torch.int32), mamba_cache_indices=live,
            mamba_track_indices=track)
        fb = types.SimpleNamespace(forward_mode=sgl.ForwardMode.DECODE, mamba_track_mask=mask, batch_size=len(rows))
        with torch.no_grad():
            return [self.hybrid.forward(layer=sgl.layers[lid], forward_batch=fb, mixed_qkv=q.clone(), a=a, b=b)
                    for lid, (q, a, b) in zip(LAYER_IDS, inputs)]


def gdn_schedule(steps, seed=99):
    gen = torch.Generator().manual_seed(seed)
    return [(rows, lens, [tuple(torch.randn(len(rows), w, generator=gen) for w in (QKV, HV, HV)) for _ in LAYER_IDS])
            for rows, lens, _ in schedule(steps)]


@pytest.mark.parametrize("L", [4, 2])
def test_gdn_track_slots_equal_stock_sglang(gdn_sgl, monkeypatch, L):
    """The same for GDN layers (one all-layers track copy per forward, at the last GDN layer)."""
    from sglang_replayssm.patches import gdn_decode

    sched = gdn_schedule(10)
    ref = run(GDNServer(gdn_sgl), sched)
    apply(gdn_decode.PATCHES + prefix_track.PATCHES)
    srv = GDNServer(gdn_sgl, ring_len=L)
    got = run(srv, sched)
    assert set(got) == set(ref) and len(got) >= 6
    for key, (temporal, conv) in got.items():
        t_ref, c_ref = ref[key]
        err = float((temporal - t_ref).abs().max()) / (float(t_ref.abs().max()) + 1.0)
        assert err < TOL, (key, err)
        assert torch.equal(conv, c_ref), key
        assert int(srv.ring.write_pos[key[0]]) == 0
    assert int(srv.ring.write_pos[2]) == 10 % L and int(srv.ring.write_pos[5]) == 9 % L
