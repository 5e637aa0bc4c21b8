"""The GDN decode seam against the real SGLang 0.5.17 classes, on CPU.

Real: ``HybridReqToTokenPool`` / ``MambaPool`` with GDN cache params (as
``Qwen3NextConfig.mamba2_cache_params`` builds them), ``RadixLinearAttention`` layers
(two GDN layers, Hk=2 HV=4 K=V=16), ``HybridLinearAttnBackend.forward`` ->
``forward_decode`` -> ``GDNAttnBackend.forward_decode`` (so the backend receives the
exact keyword layout SGLang passes), ``GDNKernelDispatcher`` with SGLang's
``TritonGDNKernel``, SGLang's Triton ``causal_conv1d_update`` and
``fused_recurrent_gated_delta_rule_packed_decode`` (the reference), all in Triton's CPU
interpreter.  One interpreter shim: ``fused_recurrent`` binds ``exp = tl.exp`` (from
``fla/op.py``) as a module global, and Triton's CPU interpreter only swaps builtins it
reaches through ``tl.``, so that global is rebound to a ``@triton.jit`` function that
calls ``tl.exp`` (the same math).  Test-only shortcuts, none of which the decode math depends on: the two
backend objects are made with ``object.__new__`` plus the fields the decode path reads
(their constructors want a ModelRunner), and the metadata is SGLang's ``ForwardMetadata``
filled as ``_forward_metadata`` fills it for a decode batch (one slot per row, -1 for
padded rows, 0 for graph-capture dummy rows).

The ring is built here (``ReplayRing``) and attached as ``mamba_pool.rssm_ring``, the
interface ``patches/pool.py`` provides.
"""

import types
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from sglang_replayssm.patches import _cursor, launch_check_patches, replay_ring_patches
from sglang_replayssm.patches import gdn_decode as gdn
from sglang_replayssm.patches import mamba2_decode as m2d
from sglang_replayssm.patches.registry import apply, is_patched, status, unapply_all, verify
from sglang_replayssm.ring import GDNRingGeometry, Mamba2RingGeometry, ReplayRing

HK, HV, K, V, KCONV = 2, 4, 16, 16, 4
QKV = 2 * HK * K + HV * V
LAYER_IDS = (1, 3)          # global ids of the GDN layers -> pool indices 0, 1; 0 and 2 are full attention
MAMBA_SIZE = 6              # slots 1..6 usable, 0 is the dummy
ROOT = Path(__file__).resolve().parents[2]


@triton.jit
def _interp_exp(x):
    return tl.exp(x)


@pytest.fixture(scope="module")
def sgl():
    import sglang.srt.layers.attention.hybrid_linear_attn_backend as hlab
    import sglang.srt.layers.attention.linear.gdn_backend as gb
    from sglang.kernels.ops.attention.fla import fused_recurrent
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape
    from sglang.srt.layers.attention.linear.utils import LinearAttnKernelBackend
    from sglang.srt.layers.attention.mamba.mamba2_metadata import ForwardMetadata
    from sglang.srt.layers.radix_linear_attention import RadixLinearAttention
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=HV * V, n_groups=HK, num_heads=HV,
                                    head_dim=V, state_size=K, conv_kernel=KCONV,
                                    conv_shard_groups=[HK * K, HK * K, HV * V])
    # fp32: tight comparisons; bf16: Qwen3-Next's serving dtypes (bf16 activations + conv state, fp32 SSM state)
    params = {act: Mamba2CacheParams(shape=shape, layers=list(LAYER_IDS),
                                     dtype=Mamba2StateDType(conv=act, temporal=torch.float32))
              for act in (torch.float32, torch.bfloat16)}
    assert tuple(shape.temporal) == (HV, V, K) and shape.conv[0][0] == QKV
    gen = torch.Generator().manual_seed(4321)
    layers = {torch.float32: {}, torch.bfloat16: {}}
    for lid in LAYER_IDS:
        w, bias = torch.randn(QKV, KCONV, generator=gen) * 0.4, torch.randn(QKV, generator=gen) * 0.1
        A_log, dt_bias = torch.randn(HV, generator=gen) * 0.5, torch.randn(HV, generator=gen) * 0.5
        for act in layers:  # A_log stays fp32 (as Qwen3-Next keeps it), dt_bias in the model dtype
            layers[act][lid] = RadixLinearAttention(
                lid, num_q_heads=HK, num_k_heads=HK, num_v_heads=HV, head_q_dim=K, head_k_dim=K, head_v_dim=V,
                conv_weights=w.to(act), bias=bias.to(act), activation="silu", A_log=A_log, dt_bias=dt_bias.to(act))
    triton_backend = LinearAttnKernelBackend.TRITON
    mp = pytest.MonkeyPatch()
    mp.setattr(fused_recurrent, "exp", _interp_exp)
    yield types.SimpleNamespace(
        hlab=hlab, gb=gb, params=params, layers=layers, ForwardMetadata=ForwardMetadata, ForwardMode=ForwardMode,
        HybridReqToTokenPool=HybridReqToTokenPool,
        dispatcher=lambda: gb.GDNKernelDispatcher(triton_backend, triton_backend))
    mp.undo()


@pytest.fixture(autouse=True)
def _clean():
    unapply_all()
    yield
    unapply_all()


class Harness:
    """A real pool + GDN backend (behind a HybridLinearAttnBackend) with seeded states."""

    def __init__(self, sgl, *, seed=7, act=torch.float32):
        self.sgl = sgl
        self.act = act
        self.layers = sgl.layers[act]
        self.pool = sgl.HybridReqToTokenPool(
            size=8, mamba_size=MAMBA_SIZE, mamba_spec_state_size=8, max_context_len=64, device="cpu",
            enable_memory_saver=False, cache_params=sgl.params[act], mamba_layer_ids=list(LAYER_IDS),
            enable_mamba_extra_buffer=False)
        gen = torch.Generator().manual_seed(seed)
        cache = self.pool.mamba_pool.mamba_cache
        cache.temporal.copy_(torch.randn(cache.temporal.shape, generator=gen) * 0.3)
        cache.conv[0].copy_(torch.randn(cache.conv[0].shape, generator=gen) * 0.5)
        assert cache.conv[0].dtype == act and cache.temporal.dtype == torch.float32
        b = object.__new__(sgl.gb.GDNAttnBackend)
        b.req_to_token_pool = self.pool
        b.is_draft_worker = False
        b.enable_unified_memory = False
        b.forward_metadata = None
        b.mis_metadata = None  # 0.5.23: set by its init_forward_metadata (None: no multi-item scoring)
        # 0.5.23: the verify scratch row per request (row i for request i without PP; + the padding row)
        b.verify_intermediate_state_indices = torch.arange(MAMBA_SIZE + 2, dtype=torch.int32)
        b.kernel_dispatcher = sgl.dispatcher()
        self.backend = b
        hy = object.__new__(sgl.hlab.HybridLinearAttnBackend)
        hy.full_attn_layers = [0, 2]
        hy.linear_attn_backend = b
        hy.full_attn_backend = None
        self.hybrid = hy
        self.ring = None

    @property
    def temporal(self):
        return self.pool.mamba_pool.mamba_cache.temporal

    @property
    def conv(self):
        return self.pool.mamba_pool.mamba_cache.conv[0]

    def attach_ring(self, L):
        geom = GDNRingGeometry(HK, HV, K, V, L, act_dtype=self.act, state_dtype=torch.float32)
        self.ring = ReplayRing(geom, num_layers=len(LAYER_IDS), num_slots=MAMBA_SIZE + 1)
        setattr(self.pool.mamba_pool, gdn.RING_ATTR, self.ring)
        return self.ring

    def set_metadata(self, slots, mode=None):
        sgl = self.sgl
        bs = len(slots)
        self.backend.forward_metadata = sgl.ForwardMetadata(
            query_start_loc=torch.arange(bs + 1, dtype=torch.int32),
            mamba_cache_indices=torch.tensor(slots, dtype=torch.int32))
        mode = mode or sgl.ForwardMode.DECODE  # 0.5.23 dispatches linear layers on logical_forward_mode
        return types.SimpleNamespace(forward_mode=mode, logical_forward_mode=mode, mamba_track_mask=None,
                                     batch_size=bs)

    def layer(self, lid, inp, fb):
        mixed_qkv, a, b = inp
        with torch.no_grad():
            return self.hybrid.forward(layer=self.layers[lid], forward_batch=fb, mixed_qkv=mixed_qkv.clone(),
                                       a=a, b=b)

    def forward(self, slots, inputs):
        fb = self.set_metadata(slots)
        return [self.layer(lid, inp, fb) for lid, inp in zip(LAYER_IDS, inputs)]


def make_inputs(schedule, seed=99, act=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for slots in schedule:
        n = len(slots)
        out.append([tuple((torch.randn(n, w, generator=gen) * sc).to(act) for w, sc in ((QKV, 1.0), (HV, 1.0), (HV, 1.0)))
                    for _ in LAYER_IDS])
    return out


def run_stock(sgl, schedule, inputs, act=torch.float32):
    unapply_all()
    h = Harness(sgl, act=act)
    outs, temporals, convs = [], [], []
    for slots, inp in zip(schedule, inputs):
        outs.append([o.clone() for o in h.forward(slots, inp)])
        temporals.append(h.temporal.clone())
        convs.append(h.conv.clone())
    return outs, temporals, convs


def _conv_update_fp32(x, conv_state, weight, bias, activation, conv_state_indices):
    """CPU shim for the bf16 case: SGLang's Triton ``causal_conv1d_update`` returns NaNs for
    bf16 in Triton's CPU interpreter, so run that same kernel in fp32 and round back to
    bf16 (state in place, output in x's dtype).  Identical for the stock and the patched
    run; the seam never touches the conv path."""
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

    st = conv_state.float()
    y = causal_conv1d_update(x.float(), st, weight.float(), None if bias is None else bias.float(), activation,
                             conv_state_indices=conv_state_indices)
    conv_state.copy_(st)
    return y.to(x.dtype)


# Requests join, leave and permute; padded rows (-1) and a graph-capture dummy row (0).
SCHEDULE = [
    [2], [2, 5], [5, 2, -1], [2, 5], [4, 2, 5], [2, 5, 4, -1], [0, 4, 2, 5],
    [5, 4], [2, 4, 5], [4, 5, 2, -1], [2, 5, 4], [5, 2, 4],
]


@pytest.mark.parametrize("L,steps,act", [(4, len(SCHEDULE), torch.float32), (1, 3, torch.float32),
                                         (3, 7, torch.bfloat16)], ids=["L4-fp32", "L1-fp32", "L3-bf16"])
def test_decode_matches_sglang_packed_decode(sgl, monkeypatch, L, steps, act):
    """Outputs equal SGLang's fused_recurrent_gated_delta_rule_packed_decode every step
    (padded rows: both exactly 0); the checkpoint equals SGLang's state on flush steps and
    is untouched otherwise; cursors advance once per forward; conv state, dummy slot and
    unused slots are exactly as SGLang leaves them (the dummy's state is never written)."""
    if act == torch.bfloat16:
        monkeypatch.setattr(sgl.gb, "causal_conv1d_update", _conv_update_fp32)
    schedule = SCHEDULE[:steps]
    inputs = make_inputs(schedule, act=act)
    ref_outs, ref_temporal, ref_conv = run_stock(sgl, schedule, inputs, act)
    # bf16: outputs are bf16 (1 ulp = 2^-8 relative), and in Triton's CPU interpreter SGLang's
    # ``sigmoid(b).to(bf16)`` truncates beta while the replay kernel rounds it to nearest (as
    # the GPU does for both), a 2^-8 relative beta difference per step that reaches the state
    tol = dict(rtol=2e-5, atol=2e-5) if act == torch.float32 else dict(rtol=8e-3, atol=8e-3)
    state_tol = dict(rtol=5e-5, atol=5e-5) if act == torch.float32 else dict(rtol=5e-3, atol=5e-3)

    h = Harness(sgl, act=act)
    ring = h.attach_ring(L)
    apply(gdn.PATCHES)
    verify(gdn.PATCHES)
    init_temporal = h.temporal.clone()
    checkpoint = h.temporal.clone()
    steps_of = {s: 0 for s in range(MAMBA_SIZE + 1)}
    for t, (slots, inp) in enumerate(zip(schedule, inputs)):
        outs = h.forward(slots, inp)
        live = [r for r, s in enumerate(slots) if s > 0]
        pad = [r for r, s in enumerate(slots) if s < 0]
        for lo, ro in zip(outs, ref_outs[t]):
            assert lo.shape == ro.shape == (1, len(slots), HV, V) and lo.dtype == ro.dtype
            torch.testing.assert_close(lo[:, live], ro[:, live], **tol,
                                       msg=lambda m, t=t: f"step {t}: {m}")
            assert not lo[:, pad].any() and not ro[:, pad].any()
        torch.testing.assert_close(h.conv, ref_conv[t], rtol=0, atol=0)  # conv path untouched
        for s in {s for s in slots if s > 0}:
            steps_of[s] += 1
            if steps_of[s] % L == 0:  # this step flushed slot s: checkpoint == SGLang's state now
                torch.testing.assert_close(h.temporal[:, s], ref_temporal[t][:, s], **state_tol,
                                           msg=lambda m, t=t, s=s: f"step {t} slot {s}: flushed checkpoint: {m}")
                checkpoint[:, s] = h.temporal[:, s]
        torch.testing.assert_close(h.temporal, checkpoint, rtol=0, atol=0,
                                   msg=f"step {t}: state written off a flush step")
        want_wp = torch.tensor([steps_of[s] % L for s in range(MAMBA_SIZE + 1)], dtype=torch.int32)
        assert torch.equal(ring.write_pos, want_wp), (t, ring.write_pos.tolist(), want_wp.tolist())
    for s in (0, 1, 3, 6):  # dummy + never-used slots: no state, ring or cursor write at all
        assert torch.equal(h.temporal[:, s], init_temporal[:, s])
        for name, tens in ring.tensors.items():
            assert not tens[:, s].any(), f"ring {name} written at slot {s}"
    if steps == len(SCHEDULE):  # several flush cycles per slot, cursors out of phase
        assert steps_of[2] > 2 * L and steps_of[4] % L != steps_of[2] % L


def test_pending_ring_folds_to_sglangs_state(sgl):
    """What the seam appends to the ring is the history SGLang's state went through: after
    5 decode steps at L=4 (slots 2 and 5 one entry past a flush, slot 4 mid-cycle), the
    slot-lifecycle fold (``lifecycle.fold_slots``) gives SGLang's state for every slot."""
    from sglang_replayssm.patches import lifecycle

    schedule = SCHEDULE[:5]
    inputs = make_inputs(schedule, seed=5)
    _, ref_temporal, _ = run_stock(sgl, schedule, inputs)
    h = Harness(sgl)
    ring = h.attach_ring(4)
    apply(gdn.PATCHES)
    try:
        for slots, inp in zip(schedule, inputs):
            h.forward(slots, inp)
        assert ring.write_pos[[2, 4, 5]].tolist() == [1, 1, 0]
        assert not torch.allclose(h.temporal[:, 2], ref_temporal[-1][:, 2], atol=1e-3)  # pending entries
        assert lifecycle.fold_slots(h.pool.mamba_pool, torch.tensor([2, 4, 5]))
        torch.testing.assert_close(h.temporal, ref_temporal[-1], rtol=5e-5, atol=5e-5)
        assert not ring.write_pos.any()
    finally:
        lifecycle.clear_layer_params(ring)


def test_cursor_advances_once_per_forward_after_the_last_layer(sgl):
    h = Harness(sgl)
    ring = h.attach_ring(4)
    ring.write_pos[2] = 3   # next decode of slot 2 flushes
    ring.write_pos[5] = 1
    apply(gdn.PATCHES)
    inp = make_inputs([[2, 5, -1]])[0]
    before = ring.write_pos.clone()
    fb = h.set_metadata([2, 5, -1])
    h.layer(LAYER_IDS[0], inp[0], fb)
    assert torch.equal(ring.write_pos, before), "cursor moved before the last GDN layer"
    h.layer(LAYER_IDS[1], inp[1], fb)
    want = before.clone()
    want[2], want[5] = 0, 2
    assert torch.equal(ring.write_pos, want) and ring.write_pos.dtype == torch.int32
    from sglang_replayssm.patches import lifecycle

    assert {i: p.use_qk_l2norm for i, p in lifecycle.layer_params(ring).items()} == {0: True, 1: True}
    # a forward must start at the first GDN layer
    h.set_metadata([2, 5])
    with pytest.raises(gdn.ReplayDecodeError, match="out of order"):
        h.layer(LAYER_IDS[1], inp[1], fb)
    assert torch.equal(ring.write_pos, want)
    # the last layer twice in one forward: the cursor advanced once, the repeat is refused
    fb = h.set_metadata([2, 5, -1])
    h.layer(LAYER_IDS[0], inp[0], fb)
    h.layer(LAYER_IDS[1], inp[1], fb)
    want[2], want[5] = 1, 3
    assert torch.equal(ring.write_pos, want)
    with pytest.raises(gdn.ReplayDecodeError, match="out of order"):
        h.layer(LAYER_IDS[1], inp[1], fb)
    assert torch.equal(ring.write_pos, want)
    # a forward abandoned half-way (an error elsewhere) is dropped when the next one starts
    h.layer(LAYER_IDS[0], inp[0], fb)
    h.layer(LAYER_IDS[0], inp[0], fb)
    h.layer(LAYER_IDS[1], inp[1], fb)
    want[2], want[5] = 2, 0
    assert torch.equal(ring.write_pos, want)


def test_cursor_helpers_are_shared_with_mamba2():
    """One implementation of the cursor gather/advance and the error type for both seams."""
    assert m2d.gather_cursors is _cursor.gather_cursors and m2d.advance_cursors is _cursor.advance_cursors
    assert m2d.ReplayDecodeError is gdn.ReplayDecodeError is _cursor.ReplayDecodeError
    assert m2d.NULL_SLOT == _cursor.NULL_SLOT == 0


def test_no_ring_and_draft_worker_keep_sglangs_path(sgl):
    """Without a ring (patched) and on a draft worker: bit-identical to SGLang, ring untouched."""
    slots = [3, 1, -1]
    inputs = make_inputs([slots])[0]
    ref = Harness(sgl)
    ref_outs = ref.forward(slots, inputs)

    h = Harness(sgl)
    apply(gdn.PATCHES)
    outs = h.forward(slots, inputs)
    for a, b in zip(outs, ref_outs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert torch.equal(h.temporal, ref.temporal) and torch.equal(h.conv, ref.conv)

    h = Harness(sgl)
    ring = h.attach_ring(4)
    h.backend.is_draft_worker = True
    outs = h.forward(slots, inputs)
    for a, b in zip(outs, ref_outs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert torch.equal(h.temporal, ref.temporal)
    assert not ring.write_pos.any() and all(not t.any() for t in ring.tensors.values())


def test_no_context_packed_decode_passes_the_same_arguments(sgl):
    """Outside a replay forward the patched dispatcher hands the kernel the very same arguments."""
    seen = []

    class Recorder:
        supports_packed_decode = True

        def packed_decode(self, *args, **kwargs):
            seen.append((args, kwargs))
            return "sentinel"

    apply(gdn.PATCHES)
    d = sgl.dispatcher()
    assert is_patched(type(d).packed_decode, gdn.PACKED_DECODE_TARGET)
    d.decode_kernel = Recorder()
    x, a, b = torch.zeros(2, QKV), torch.zeros(2, HV), torch.zeros(2, HV)
    st, idx = torch.zeros(3, HV, V, K), torch.tensor([1, 2], dtype=torch.int32)
    r = d.packed_decode(mixed_qkv=x, a=a, b=b, A_log=a[0], dt_bias=b[0], scale=0.25, ssm_states=st,
                        cache_indices=idx, num_v_heads=HV, head_v_dim=V, replayssm_d=None, replayssm_write_pos=None)
    assert r == "sentinel"
    (args, kwargs), = seen
    assert args[0] is x and args[1] is a and args[2] is b
    assert kwargs["ssm_states"] is st and kwargs["cache_indices"] is idx and kwargs["scale"] == 0.25
    assert "replayssm_d" in kwargs and kwargs["replayssm_d"] is None


def test_extend_verify_pass_through_and_mixed_is_refused(sgl):
    """forward_extend: EXTEND / TARGET_VERIFY / a draft's MIXED reach SGLang untouched; a target
    MIXED forward under a GDN ring is refused before SGLang runs; no cursor move."""
    h = Harness(sgl)
    ring = h.attach_ring(4)
    ring.write_pos[2] = 1
    calls = []

    def original(self, layer, forward_batch, mixed_qkv, a, b, **kw):
        calls.append((self, layer, forward_batch.forward_mode, mixed_qkv, kw))
        return "sglang"

    lay = h.layers[LAYER_IDS[0]]
    x = torch.zeros(3, QKV)
    for mode in (sgl.ForwardMode.EXTEND, sgl.ForwardMode.TARGET_VERIFY):
        fb = types.SimpleNamespace(forward_mode=mode, mamba_track_mask=None)
        assert gdn.forward_extend_around(original, h.backend, lay, fb, x, None, None, save_kv_cache=True) == "sglang"
    assert [c[2] for c in calls] == [sgl.ForwardMode.EXTEND, sgl.ForwardMode.TARGET_VERIFY]
    assert calls[0][4] == {"save_kv_cache": True} and calls[0][3] is x
    fb = types.SimpleNamespace(forward_mode=sgl.ForwardMode.MIXED, logical_forward_mode=sgl.ForwardMode.MIXED,
                               mamba_track_mask=None)
    with pytest.raises(gdn.ReplayDecodeError, match="enable-mixed-chunk"):
        gdn.forward_extend_around(original, h.backend, lay, fb, x, None, None)
    h.backend.is_draft_worker = True
    assert gdn.forward_extend_around(original, h.backend, lay, fb, x, None, None) == "sglang"
    h.backend.is_draft_worker = False
    delattr(h.pool.mamba_pool, gdn.RING_ATTR)
    assert gdn.forward_extend_around(original, h.backend, lay, fb, x, None, None) == "sglang"
    # through the installed patch and SGLang's own router: refused before SGLang's extend runs
    setattr(h.pool.mamba_pool, gdn.RING_ATTR, ring)
    apply(gdn.PATCHES)
    h.set_metadata([2])
    with pytest.raises(gdn.ReplayDecodeError, match="enable-mixed-chunk"):
        h.hybrid.forward(layer=lay, forward_batch=fb, mixed_qkv=torch.zeros(1, QKV), a=torch.zeros(1, HV),
                         b=torch.zeros(1, HV))
    assert ring.write_pos.tolist() == [0, 0, 1, 0, 0, 0, 0]


def test_refusals_under_a_ring(sgl):
    """Upstream's own ring, extra_buffer tracking, a non-packed decode kernel, a wrong ring
    and unexpected packed calls all raise; the state, ring and cursors stay untouched."""
    slots = [2, 5]
    inp = make_inputs([slots])[0]
    apply(gdn.PATCHES)

    def fresh():
        h = Harness(sgl)
        h.attach_ring(4)
        return h

    cases = []
    h = fresh()
    h.pool.mamba_pool.enable_linear_replayssm = True
    cases.append((h, None, "enable-linear-replayssm"))
    h = fresh()
    h.pool.mamba_pool.enable_linear_replayssm_spec = True
    cases.append((h, None, "enable-linear-replayssm"))
    h = fresh()
    cases.append((h, lambda fb: setattr(h.backend.forward_metadata, "replayssm_write_pos",
                                        torch.zeros(2, dtype=torch.int32)), "enable-linear-replayssm"))
    h2 = fresh()
    cases.append((h2, lambda fb: setattr(fb, "mamba_track_mask", torch.zeros(2, dtype=torch.bool)), "extra_buffer"))
    h3 = fresh()
    h3.backend.kernel_dispatcher.supports_packed_decode = False
    cases.append((h3, None, "linear-attn-decode-backend triton"))
    h4 = fresh()
    setattr(h4.pool.mamba_pool, gdn.RING_ATTR, ReplayRing(Mamba2RingGeometry(HV, V, K, HK, 4), 2, MAMBA_SIZE + 1))
    cases.append((h4, None, "GDNRingGeometry"))
    h5 = fresh()
    setattr(h5.pool.mamba_pool, gdn.RING_ATTR,
            ReplayRing(GDNRingGeometry(HK, HV, K, 2 * V, 4, act_dtype=torch.float32), 2, MAMBA_SIZE + 1))
    cases.append((h5, None, "differs from the layer"))
    for h, tweak, match in cases:
        before = h.temporal.clone()
        fb = h.set_metadata(slots)
        if tweak is not None:
            tweak(fb)
        with pytest.raises(gdn.ReplayDecodeError, match=match):
            h.layer(LAYER_IDS[0], inp[0], fb)
        ring = getattr(h.pool.mamba_pool, gdn.RING_ATTR)
        assert torch.equal(h.temporal, before) and not ring.write_pos.any()
        assert gdn.current_context() is None and getattr(h.backend, _cursor.STEP_ATTR, None) is None

    # an unexpected packed call under a context (wrong slot tensor, upstream ring args)
    h = fresh()
    real = sgl.gb.GDNKernelDispatcher.packed_decode  # the installed wrapper

    for bad, match in ((dict(cache_indices=torch.tensor([2, 5], dtype=torch.int32)), "mamba_cache_indices"),
                       (dict(replayssm_write_pos=torch.zeros(2, dtype=torch.int32)), "own replay ring"),
                       (dict(ssm_states=torch.zeros(MAMBA_SIZE + 1, HV, V, K)), "temporal cache")):
        def tampered(self, *args, _bad=bad, **kwargs):
            kwargs.update(_bad)
            return real(self, *args, **kwargs)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(h.backend.kernel_dispatcher, "packed_decode", types.MethodType(tampered,
                                                                                     h.backend.kernel_dispatcher))
            fb = h.set_metadata(slots)
            with pytest.raises(gdn.ReplayDecodeError, match=match):
                h.layer(LAYER_IDS[0], inp[0], fb)
        assert not h.ring.write_pos.any() and getattr(h.backend, _cursor.STEP_ATTR, None) is None

    # a dispatcher that never reaches packed_decode (silently SGLang's state update) is refused
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(h.backend.kernel_dispatcher, "packed_decode",
                   lambda **kw: torch.zeros(1, 2, HV, V))
        fb = h.set_metadata(slots)
        with pytest.raises(gdn.ReplayDecodeError, match="expected exactly 1"):
            h.layer(LAYER_IDS[0], inp[0], fb)
    assert not h.ring.write_pos.any()


def test_registry_apply_verify_unapply(sgl):
    patches = gdn.PATCHES
    targets = {p.target for p in patches}
    assert targets == {gdn.PACKED_DECODE_TARGET, gdn.FORWARD_DECODE_TARGET, gdn.FORWARD_EXTEND_TARGET,
                       gdn.TARGET_VERIFY_TARGET}
    seams = {p.target for p in replay_ring_patches()}
    assert targets <= seams
    assert not seams & {p.target for p in launch_check_patches()}, "seams must stay apart from the launch checks"
    B, D = sgl.gb.GDNAttnBackend, sgl.gb.GDNKernelDispatcher
    orig = {"fd": B.__dict__["forward_decode"], "fe": B.__dict__["forward_extend"], "pd": D.__dict__["packed_decode"],
            "tv": D.__dict__["target_verify"]}
    tgd = sgl.gb.TritonGDNKernel.__dict__["packed_decode"]
    assert [s for _, s, _ in status(patches)] == ["resolved"] * 4
    assert sorted(apply(patches)) == sorted(targets)
    verify(patches)
    assert B.__dict__["forward_decode"].__wrapped__ is orig["fd"]
    assert B.__dict__["forward_extend"].__wrapped__ is orig["fe"]
    assert D.__dict__["packed_decode"].__wrapped__ is orig["pd"]
    assert D.__dict__["target_verify"].__wrapped__ is orig["tv"]
    assert sgl.gb.TritonGDNKernel.__dict__["packed_decode"] is tgd  # the kernel class itself is not touched
    assert apply(patches) == []
    unapply_all()
    assert B.__dict__["forward_decode"] is orig["fd"] and B.__dict__["forward_extend"] is orig["fe"]
    assert D.__dict__["packed_decode"] is orig["pd"] and D.__dict__["target_verify"] is orig["tv"]


@pytest.mark.parametrize("version", ["0.5.15", "0.5.23"])
def test_targets_exist_in_other_releases(version):
    from sglang_replayssm.patches.source_check import WheelSource, check, locate

    from sglang_wheels import wheel_for

    found = [str(wheel_for(version))]
    assert check(gdn.PATCHES, found[0], version) == []
    src = WheelSource(found[0])
    for p in gdn.PATCHES:
        params, where = locate(src, p.target)
        assert "srt/layers/attention/linear/gdn_backend.py" in where
    # the backend hands the dispatcher the same keyword call in every release
    text = src.zip.read("sglang/srt/layers/attention/linear/gdn_backend.py").decode()
    call = text[text.index("self.kernel_dispatcher.packed_decode("):]
    call = call[: call.index(")")]
    for kw in ("mixed_qkv=mixed_qkv", "ssm_states=ssm_states", "cache_indices=cache_indices",
               "num_v_heads=layer.num_v_heads", "head_v_dim=layer.head_v_dim"):
        assert kw in call, (version, kw)
    # the layer attributes the seam reads (ring geometry check, context)
    lin = src.zip.read("sglang/srt/layers/radix_linear_attention.py").decode()
    for attr in ("layer_id", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"):
        assert f"self.{attr} = {attr}" in lin, (version, attr)
