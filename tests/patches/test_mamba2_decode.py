"""The Mamba2 decode seam against the real SGLang 0.5.17 classes, on CPU.

Real: ``MambaMixer2`` (two layers, H=4 P=16 N=16 G=2), ``HybridReqToTokenPool`` /
``MambaPool``, ``Mamba2AttnBackend.forward``, ``Mamba2Metadata.prepare_decode``,
SGLang's Triton ``causal_conv1d_update`` and its Triton ``selective_state_update`` (the
reference), all in Triton's CPU interpreter.  CPU shims, each replacing a CUDA-only or
process-setup detail that the decode math does not depend on:

* ``mamba.causal_conv1d_update_triton`` is only bound on CUDA/XPU; bind SGLang's Triton one;
* ``torch.cpu.device`` (SGLang's SSU wrapper enters ``torch.get_device_module(dev).device``);
* ``linear.get_tp_group`` (RowParallelLinear asks the TP group for symmetric memory; TP=1; 0.5.23 asks
  ``get_parallel().tp_group``, overridden instead);
* ``hybrid_linear_attn_backend.get_memory`` (server args are not published in a test);
* the backend object is made with ``object.__new__`` plus the fields ``forward`` reads
  (its constructor wants a ModelRunner), and ``ssu_dispatch``'s backend is the Triton one
  (the scheduler sets it from ``--mamba-backend``);
* ``mamba_state_scatter_triton.fused_{mamba_state,conv_window}_scatter_with_mask`` (the
  post-verify commit) refuse non-CUDA tensors: replaced by a loop with their documented
  semantics (``dst[:, dst_idx[i]] = src[:, i, step[i]]`` for ``step[i] >= 0``).

The ring is built here (``ReplayRing``) and attached as ``mamba_pool.rssm_ring``, the
interface ``patches/pool.py`` provides.
"""

import contextlib
import types
from pathlib import Path

import pytest
import torch

from sglang_replayssm.patches import launch_check_patches, replay_ring_patches
from sglang_replayssm.patches import mamba2_decode as m2d
from sglang_replayssm.patches.registry import apply, is_patched, status, unapply_all, verify
from sglang_replayssm.ring import GDNRingGeometry, Mamba2RingGeometry, ReplayRing

H, P, N, G, KCONV, HIDDEN = 4, 16, 16, 2, 4, 32
LAYER_IDS = (1, 3)          # global layer ids of the two Mamba2 layers -> pool indices 0, 1
MAMBA_SIZE = 6              # slots 1..6 usable, 0 is the dummy
ROOT = Path(__file__).resolve().parents[2]


def _mixer_result(out):
    """What a stand-in mixer's ``forward`` returns: ``(out, intermediate_states)``, plus ``track_states``
    from SGLang 0.5.23 on (its ``Mamba2AttnBackend.forward`` unpacks three)."""
    from importlib.metadata import version

    from packaging.version import Version

    return (out, None, None) if Version(version("sglang")) >= Version("0.5.23") else (out, None)


def _cpu_masked_scatter(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw=None):
    """CPU twin of SGLang's masked post-verify scatters: dst[:, d_i] = src[:, s_i, step_i] where both >= 0;
    s_i is row i, or ``src_indices_raw[i]`` (0.5.23's optional scratch rows, given only under PP)."""
    rows = range(len(dst_indices_raw)) if src_indices_raw is None else src_indices_raw.tolist()
    for d, st, s in zip(dst_indices_raw.tolist(), step_indices_raw.tolist(), rows):
        if d >= 0 and st >= 0:
            dst[:, d] = src[:, s, st]


@pytest.fixture(scope="module")
def sgl():
    import sglang.srt.layers.attention.hybrid_linear_attn_backend as hlab
    import sglang.srt.layers.linear as linear
    from sglang.kernels.ops.mamba import causal_conv1d_triton as cct
    from sglang.kernels.ops.mamba import mamba_state_scatter_triton as mss
    from sglang.kernels.ops.mamba.triton_ops import ssu_dispatch
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape
    from sglang.srt.layers.attention.mamba import mamba
    from sglang.srt.layers.attention.mamba.mamba2_metadata import ForwardMetadata, Mamba2Metadata
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.runtime_context import get_parallel

    with pytest.MonkeyPatch.context() as mp, contextlib.ExitStack() as stack:
        mp.setattr(mamba, "causal_conv1d_update_triton", cct.causal_conv1d_update, raising=False)
        mp.setattr(torch.cpu, "device", lambda index=None: contextlib.nullcontext(), raising=False)
        if hasattr(linear, "get_tp_group"):
            mp.setattr(linear, "get_tp_group", lambda: types.SimpleNamespace(world_size=1))
        else:  # 0.5.23: RowParallelLinear reads get_parallel().tp_group
            stack.enter_context(get_parallel().override(
                tp_group=types.SimpleNamespace(world_size=1, rank_in_group=0)))
        mp.setattr(hlab, "get_memory", lambda: types.SimpleNamespace(enable_page_major_kv_layout=False))
        mp.setattr(ssu_dispatch, "_mamba_ssu_backend", ssu_dispatch.TritonSSUBackend())
        mp.setattr(mss, "fused_mamba_state_scatter_with_mask", _cpu_masked_scatter)
        mp.setattr(mss, "fused_conv_window_scatter_with_mask", _cpu_masked_scatter)
        if hasattr(hlab, "fused_conv_window_scatter_with_mask"):  # 0.5.15, 0.5.23: the backend's own import
            mp.setattr(hlab, "fused_conv_window_scatter_with_mask", _cpu_masked_scatter)

        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=H * P, n_groups=G, num_heads=H,
                                        head_dim=P, state_size=N, conv_kernel=KCONV)
        params = Mamba2CacheParams(shape=shape, layers=list(LAYER_IDS),
                                   dtype=Mamba2StateDType(conv=torch.float32, temporal=torch.float32))
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
        yield types.SimpleNamespace(
            mamba=mamba, hlab=hlab, ssu_dispatch=ssu_dispatch, params=params, mixers=mixers,
            ForwardMetadata=ForwardMetadata, Mamba2Metadata=Mamba2Metadata, ForwardMode=ForwardMode,
            HybridReqToTokenPool=HybridReqToTokenPool)


@pytest.fixture(autouse=True)
def _clean():
    unapply_all()
    yield
    unapply_all()


class Harness:
    """A real pool + backend with seeded initial states; optionally a ring attached."""

    def __init__(self, sgl, *, seed=7, spec_tokens=None):
        self.sgl = sgl
        self.pool = sgl.HybridReqToTokenPool(
            size=8, mamba_size=MAMBA_SIZE, mamba_spec_state_size=8, max_context_len=64, device="cpu",
            enable_memory_saver=False, cache_params=sgl.params, mamba_layer_ids=list(LAYER_IDS),
            enable_mamba_extra_buffer=False)
        cache = self.pool.mamba_pool.mamba_cache
        if spec_tokens:  # MambaPool allocates the verify scratch with device="cuda"; same layout on CPU
            from sglang.srt.mem_cache.memory_pool import MambaPool

            nl, ns = cache.temporal.shape[:2]
            cache = MambaPool.SpeculativeState(
                conv=cache.conv, temporal=cache.temporal,
                intermediate_ssm=torch.zeros((nl, ns, spec_tokens) + tuple(cache.temporal.shape[2:])),
                intermediate_conv_window=[torch.zeros((nl, ns, spec_tokens) + tuple(c.shape[2:])) for c in cache.conv])
            self.pool.mamba_pool.mamba_cache = cache
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

    @property
    def temporal(self):
        return self.pool.mamba_pool.mamba_cache.temporal

    @property
    def conv(self):
        return self.pool.mamba_pool.mamba_cache.conv[0]

    def attach_ring(self, L, act_dtype=torch.float32):
        geom = Mamba2RingGeometry(H, P, N, G, L, act_dtype=act_dtype)
        self.ring = ReplayRing(geom, num_layers=len(LAYER_IDS), num_slots=MAMBA_SIZE + 1)
        setattr(self.pool.mamba_pool, m2d.RING_ATTR, self.ring)
        return self.ring

    def set_metadata(self, slots, *, verify_tokens=None):
        sgl = self.sgl
        bs = len(slots)
        idx = torch.tensor(slots, dtype=torch.int32)
        fm = sgl.ForwardMetadata(query_start_loc=torch.arange(bs + 1, dtype=torch.int32), mamba_cache_indices=idx)
        self.backend.forward_metadata = sgl.Mamba2Metadata.prepare_decode(
            fm, torch.ones(bs, dtype=torch.int64), is_target_verify=verify_tokens is not None,
            draft_token_num=verify_tokens or 1)
        mode = sgl.ForwardMode.TARGET_VERIFY if verify_tokens else sgl.ForwardMode.DECODE
        return types.SimpleNamespace(forward_mode=mode, mamba_track_mask=None)

    def layer(self, lid, hs, fb):
        with torch.no_grad():
            return self.sgl.hlab.Mamba2AttnBackend.forward(
                self.backend, self.sgl.mixers[lid], hs, None, lid, fb, use_triton_causal_conv=True)

    def forward(self, slots, hs_per_layer, *, verify_tokens=None):
        fb = self.set_metadata(slots, verify_tokens=verify_tokens)
        return [self.layer(lid, hs, fb) for lid, hs in zip(LAYER_IDS, hs_per_layer)]


def make_inputs(schedule, seed=99, tokens_per_row=1):
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(len(slots) * tokens_per_row, HIDDEN, generator=gen) for _ in LAYER_IDS]
            for slots in schedule]


def run_stock(sgl, schedule, inputs):
    unapply_all()
    h = Harness(sgl)
    outs, temporals, convs = [], [], []
    for slots, hs in zip(schedule, inputs):
        outs.append([o.clone() for o in h.forward(slots, hs)])
        temporals.append(h.temporal.clone())
        convs.append(h.conv.clone())
    return outs, temporals, convs


# Requests join, leave and permute; padded rows (-1) and a graph-capture dummy row (0).
SCHEDULE = [
    [2], [2, 5], [5, 2, -1], [2, 5], [4, 2, 5], [2, 5, 4, -1], [0, 4, 2, 5],
    [5, 4], [2, 4, 5], [4, 5, 2, -1], [2, 5, 4], [5, 2, 4],
]


@pytest.mark.parametrize("L,steps", [(4, len(SCHEDULE)), (1, 3)])
def test_decode_matches_sglang_selective_state_update(sgl, monkeypatch, L, steps):
    """Outputs equal SGLang's every step; the checkpoint equals SGLang's state on flush
    steps and is untouched otherwise; cursors advance once per forward; non-live slots,
    the dummy slot and the conv path are exactly as SGLang leaves them."""
    schedule = SCHEDULE[:steps]
    inputs = make_inputs(schedule)
    ref_outs, ref_temporal, ref_conv = run_stock(sgl, schedule, inputs)

    h = Harness(sgl)
    ring = h.attach_ring(L)
    apply(m2d.PATCHES)
    verify(m2d.PATCHES)
    init_temporal = h.temporal.clone()
    checkpoint = h.temporal.clone()
    steps_of = {s: 0 for s in range(MAMBA_SIZE + 1)}
    for t, (slots, hs) in enumerate(zip(schedule, inputs)):
        outs = h.forward(slots, hs)
        live = [r for r, s in enumerate(slots) if s > 0]
        for lo, ro in zip(outs, ref_outs[t]):
            torch.testing.assert_close(lo[live], ro[live], rtol=2e-4, atol=2e-4, msg=f"step {t}")
        torch.testing.assert_close(h.conv, ref_conv[t], rtol=0, atol=0)  # conv path untouched
        for s in {s for s in slots if s > 0}:
            steps_of[s] += 1
            if steps_of[s] % L == 0:  # this step flushed slot s: checkpoint == SGLang's state now
                torch.testing.assert_close(h.temporal[:, s], ref_temporal[t][:, s], rtol=2e-4, atol=2e-4,
                                           msg=f"step {t} slot {s}: flushed checkpoint")
                checkpoint[:, s] = h.temporal[:, s]
        torch.testing.assert_close(h.temporal, checkpoint, rtol=0, atol=0,
                                   msg=f"step {t}: state written off a flush step")
        want_wp = torch.tensor([steps_of[s] % L for s in range(MAMBA_SIZE + 1)], dtype=torch.int32)
        assert torch.equal(ring.write_pos, want_wp), (t, ring.write_pos.tolist(), want_wp.tolist())
    # slot 0 (dummy) and never-used slots: no state, ring or cursor write at all
    for s in (0, 1, 3, 6):
        assert torch.equal(h.temporal[:, s], init_temporal[:, s])
        for name, t in ring.tensors.items():
            assert not t[:, s].any(), f"ring {name} written at slot {s}"
    if steps == len(SCHEDULE):  # several flush cycles per slot, cursors out of phase
        assert steps_of[2] > 2 * L and steps_of[4] % L != steps_of[2] % L


def test_pending_ring_folds_to_sglangs_state(sgl):
    """The seam publishes each layer's A for the slot-lifecycle fold: after 5 decode steps at
    L=4 (entries pending in the rings), ``lifecycle.fold_slots`` gives SGLang's own state."""
    from sglang_replayssm.patches import lifecycle

    schedule = SCHEDULE[:5]
    inputs = make_inputs(schedule, seed=7)
    _, ref_temporal, _ = run_stock(sgl, schedule, inputs)
    h = Harness(sgl)
    ring = h.attach_ring(4)
    apply(m2d.PATCHES)
    try:
        for slots, hs in zip(schedule, inputs):
            h.forward(slots, hs)
        live = sorted({s for slots in schedule for s in slots if s > 0})
        pending = [s for s in live if int(ring.write_pos[s]) > 0]
        assert pending, "schedule leaves no pending ring entries"
        assert set(lifecycle.layer_params(ring)) == set(range(ring.num_layers))
        assert all(p.A is not None for p in lifecycle.layer_params(ring).values())
        assert lifecycle.fold_slots(h.pool.mamba_pool, torch.tensor(live))
        torch.testing.assert_close(h.temporal[:, live], ref_temporal[-1][:, live], rtol=2e-4, atol=2e-4)
        assert not ring.write_pos.any()
    finally:
        lifecycle.clear_layer_params(ring)


def test_cursor_advances_once_per_forward_after_the_last_layer(sgl):
    h = Harness(sgl)
    ring = h.attach_ring(4)
    ring.write_pos[2] = 3   # next decode of slot 2 flushes
    ring.write_pos[5] = 1
    apply(m2d.PATCHES)
    hs = make_inputs([[2, 5, -1]])[0]
    before = ring.write_pos.clone()
    fb = h.set_metadata([2, 5, -1])
    h.layer(LAYER_IDS[0], hs[0], fb)
    assert torch.equal(ring.write_pos, before), "cursor moved before the last mamba layer"
    h.layer(LAYER_IDS[1], hs[1], fb)
    want = before.clone()
    want[2], want[5] = 0, 2
    assert torch.equal(ring.write_pos, want)
    assert ring.write_pos.dtype == torch.int32
    # out of order: a forward must start at the first mamba layer
    h.set_metadata([2, 5])
    with pytest.raises(m2d.ReplayDecodeError, match="out of order"):
        h.layer(LAYER_IDS[1], hs[1][:2], fb)
    assert torch.equal(ring.write_pos, want)


def test_advance_cursors_rows_and_clamp():
    wp = torch.tensor([5, 1, 2, 3, 0, 9, 2, 0], dtype=torch.int32)
    slots = torch.tensor([-1, 0, 2, 3, 5, -1, 6], dtype=torch.int32)
    rows = m2d.gather_cursors(wp, slots)
    assert rows.tolist() == [5, 5, 2, 3, 9, 5, 2]
    m2d.advance_cursors(wp, slots, rows, 4)
    # slot 2: 2->3; slot 3: 3 (= L-1, flush) -> 0; slot 5: 9 clamps to 3 -> 0; slot 6: 2->3
    assert wp.tolist() == [5, 1, 3, 0, 0, 0, 3, 0]
    assert wp.dtype == torch.int32


def test_advance_is_device_only_no_host_sync(monkeypatch):
    """Gather + advance use no host readback (CUDA-graph safe): trap every Tensor->host path."""
    wp = torch.zeros(8, dtype=torch.int32)
    slots = torch.tensor([3, -1, 0, 7], dtype=torch.int32)

    def trap(*a, **k):
        raise AssertionError("host sync")

    from sglang_replayssm.kernels import decode_cursor

    # the launches are recorded, not run: Triton's CPU interpreter itself copies tensors to the host
    launches = []

    class Rec:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((grid, args, kw))

    monkeypatch.setattr(decode_cursor, "_decode_cursor_kernel", Rec())
    for name in ("item", "tolist", "__bool__", "__int__", "__index__", "nonzero", "cpu", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, trap)
    rows = m2d.gather_cursors(wp, slots)
    m2d.advance_cursors(wp, slots, rows, 4)
    monkeypatch.undo()
    assert [kw["ADVANCE"] for _, _, kw in launches] == [False, True]  # one launch each
    assert launches[1][1][:3] == (slots, wp, rows)


def test_target_verify_and_draft_worker_keep_sglangs_path(sgl):
    """TARGET_VERIFY (SGLang's intermediate-state verify call) and a draft worker's decode
    run exactly SGLang's code: same outputs and buffers, ring and cursors untouched."""
    D = 2
    slots = [3, 1, -1]
    inputs = make_inputs([slots], tokens_per_row=D)[0]

    def verify_run(patched):
        unapply_all()
        h = Harness(sgl, spec_tokens=D)
        ring = None
        if patched:
            ring = h.attach_ring(4)
            ring.write_pos[3] = 2
            apply(m2d.PATCHES)
        outs = h.forward(slots, inputs, verify_tokens=D)
        inter = h.pool.mamba_pool.mamba_cache.intermediate_ssm.clone()
        return outs, inter, h.temporal.clone(), ring

    ref_outs, ref_inter, ref_temporal, _ = verify_run(False)
    outs, inter, temporal, ring = verify_run(True)
    for a, b in zip(outs, ref_outs):  # the padded row's tokens (4, 5) are undefined in SGLang too
        torch.testing.assert_close(a[:4], b[:4], rtol=0, atol=0)
    assert torch.equal(inter, ref_inter) and torch.equal(temporal, ref_temporal)
    assert ring.write_pos.tolist() == [0, 0, 0, 2, 0, 0, 0]
    assert all(not t.any() for t in ring.tensors.values())

    # draft worker: plain decode, but SGLang's state update (the state is written, ring untouched)
    dec = make_inputs([[3, 1]])[0]
    unapply_all()
    ref = Harness(sgl)
    ref_outs = ref.forward([3, 1], dec)
    h = Harness(sgl)
    ring = h.attach_ring(4)
    h.backend.is_draft_worker = True
    apply(m2d.PATCHES)
    outs = h.forward([3, 1], dec)
    for a, b in zip(outs, ref_outs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert torch.equal(h.temporal, ref.temporal)
    assert not ring.write_pos.any() and all(not t.any() for t in ring.tensors.values())


def test_no_context_calls_pass_through_unchanged(sgl, monkeypatch):
    """Outside a replay forward the patched global hands SGLang's dispatcher the very same arguments."""
    seen = []

    class Recorder:
        name = "recorder"

        def __call__(self, *args, **kwargs):
            seen.append((args, kwargs))

    monkeypatch.setattr(sgl.ssu_dispatch, "_mamba_ssu_backend", Recorder())
    apply(m2d.PATCHES)
    assert is_patched(sgl.mamba.selective_state_update, m2d.SSU_TARGET)
    state = torch.zeros(3, H, P, N)
    x = torch.randn(2, H, P)
    idx = torch.tensor([1, 2], dtype=torch.int32)
    out = torch.empty(2, H, P)
    assert sgl.mamba.selective_state_update(state, x, x, x, x, x, None, z=None, dt_bias=None, dt_softplus=True,
                                            state_batch_indices=idx, out=out) is None
    (args, kwargs), = seen
    assert args[0] is state and args[1] is x and kwargs["state_batch_indices"] is idx and kwargs["out"] is out
    assert kwargs["dt_softplus"] is True and kwargs["disable_state_update"] is False


def test_prefill_and_mixed_forwards(sgl):
    """num_decodes == 0 (extend) runs with no context and no cursor move; MIXED is refused."""
    h = Harness(sgl)
    ring = h.attach_ring(4)
    ring.write_pos[2] = 1
    apply(m2d.PATCHES)
    seen = []

    class FakeMixer:
        def forward(self, **kw):
            seen.append(m2d.current_context())
            return _mixer_result(kw["hidden_states"])

    md = sgl.Mamba2Metadata(query_start_loc=torch.tensor([0, 3], dtype=torch.int32),
                            mamba_cache_indices=torch.tensor([2], dtype=torch.int32),
                            num_prefills=1, num_prefill_tokens=3, num_decodes=0)
    h.backend.forward_metadata = md
    fb = types.SimpleNamespace(forward_mode=sgl.ForwardMode.EXTEND, mamba_track_mask=None)
    for lid in LAYER_IDS:
        sgl.hlab.Mamba2AttnBackend.forward(h.backend, FakeMixer(), torch.zeros(3, HIDDEN), None, lid, fb)
    assert seen == [None, None] and ring.write_pos[2] == 1
    fb.forward_mode = sgl.ForwardMode.MIXED
    with pytest.raises(m2d.ReplayDecodeError, match="enable-mixed-chunk"):
        sgl.hlab.Mamba2AttnBackend.forward(h.backend, FakeMixer(), torch.zeros(3, HIDDEN), None, LAYER_IDS[0], fb)
    # extra_buffer tracking on a decode forward is refused too
    fb = h.set_metadata([2])
    fb.mamba_track_mask = torch.zeros(1, dtype=torch.bool)
    with pytest.raises(m2d.ReplayDecodeError, match="extra_buffer"):
        h.layer(LAYER_IDS[0], torch.zeros(1, HIDDEN), fb)
    assert ring.write_pos[2] == 1


def test_guards_under_a_context(sgl):
    """A mixer that never reaches the global, or an unexpected call shape, raises instead of
    silently computing from a stale checkpoint; the cursor does not move."""
    h = Harness(sgl)
    ring = h.attach_ring(4)
    apply(m2d.PATCHES)

    class SilentMixer:
        def forward(self, **kw):
            return _mixer_result(kw["hidden_states"])

    fb = h.set_metadata([2, 5])
    with pytest.raises(m2d.ReplayDecodeError, match="expected exactly 1"):
        sgl.hlab.Mamba2AttnBackend.forward(h.backend, SilentMixer(), torch.zeros(2, HIDDEN), None, LAYER_IDS[0], fb)

    class WrongSlotsMixer:
        def forward(self, **kw):
            st = kw["layer_cache"].temporal
            x = torch.zeros(2, H, P)
            sgl.mamba.selective_state_update(st, x, x, torch.zeros(H, P, N), torch.zeros(2, G, N),
                                             torch.zeros(2, G, N), state_batch_indices=torch.tensor([2, 5]),
                                             out=torch.empty(2, H, P))
            return _mixer_result(kw["hidden_states"])

    with pytest.raises(m2d.ReplayDecodeError, match="decode-row slots"):
        sgl.hlab.Mamba2AttnBackend.forward(h.backend, WrongSlotsMixer(), torch.zeros(2, HIDDEN), None,
                                           LAYER_IDS[0], fb)

    class VerifyShapedMixer:
        def forward(self, **kw):
            st = kw["layer_cache"].temporal
            x = torch.zeros(2, 1, H, P)
            bc = torch.zeros(2, 1, G, N)
            sgl.mamba.selective_state_update(st, x, x, torch.zeros(H, P, N), bc, bc,
                                             state_batch_indices=kw["metadata"].mamba_cache_indices,
                                             out=torch.empty(2, 1, H, P), disable_state_update=True)
            return _mixer_result(kw["hidden_states"])

    with pytest.raises(m2d.ReplayDecodeError, match="verify call"):
        sgl.hlab.Mamba2AttnBackend.forward(h.backend, VerifyShapedMixer(), torch.zeros(2, HIDDEN), None,
                                           LAYER_IDS[0], fb)
    assert not ring.write_pos.any() and m2d.current_context() is None

    setattr(h.pool.mamba_pool, m2d.RING_ATTR, ReplayRing(GDNRingGeometry(1, 1, 16, 16, 4), 2, MAMBA_SIZE + 1))
    with pytest.raises(m2d.ReplayDecodeError, match="Mamba2RingGeometry"):
        h.layer(LAYER_IDS[0], torch.zeros(2, HIDDEN), fb)


def test_decode_call_reaches_the_kernel(sgl, monkeypatch):
    import sglang_replayssm.kernels.mamba2_replay as kmod

    calls = []
    real = kmod.mamba2_replay_decode

    def spy(*a, **k):
        calls.append((sorted(k), k["null_slot"], k["dt_softplus"], a[10].dtype))
        return real(*a, **k)

    monkeypatch.setattr(kmod, "mamba2_replay_decode", spy)
    h = Harness(sgl)
    h.attach_ring(4)
    apply(m2d.PATCHES)
    h.forward([2], make_inputs([[2]])[0])
    kwargs = ["D", "dt_bias", "dt_softplus", "null_slot", "out", "z"]
    assert calls == [(kwargs, 0, True, torch.int32)] * len(LAYER_IDS)


def test_registry_apply_verify_unapply(sgl):
    from sglang.kernels.ops.mamba import triton_ops

    patches = m2d.PATCHES
    assert {p.target for p in patches} == {m2d.SSU_TARGET, m2d.BACKEND_FORWARD_TARGET}
    seams = {p.target for p in replay_ring_patches()}
    assert {p.target for p in patches} <= seams
    assert not seams & {p.target for p in launch_check_patches()}, "seams must stay apart from the launch checks"
    orig_ssu = sgl.mamba.selective_state_update
    orig_fwd = sgl.hlab.Mamba2AttnBackend.__dict__["forward"]
    assert [s for _, s, _ in status(patches)] == ["resolved", "resolved"]
    assert sorted(apply(patches)) == sorted(p.target for p in patches)
    verify(patches)
    assert sgl.mamba.selective_state_update.__wrapped__ is orig_ssu
    assert sgl.hlab.Mamba2AttnBackend.__dict__["forward"].__wrapped__ is orig_fwd
    # only mamba.py's binding is replaced: the dispatcher's own module and the re-export keep theirs
    assert sgl.ssu_dispatch.selective_state_update is orig_ssu and triton_ops.selective_state_update is orig_ssu
    assert apply(patches) == []
    unapply_all()
    assert sgl.mamba.selective_state_update is orig_ssu
    assert sgl.hlab.Mamba2AttnBackend.__dict__["forward"] is orig_fwd


@pytest.mark.parametrize("version", ["0.5.15", "0.5.23"])
def test_targets_exist_in_other_releases(version):
    from sglang_replayssm.patches.source_check import WheelSource, check, locate

    from sglang_wheels import wheel_for

    found = [str(wheel_for(version))]
    assert check(m2d.PATCHES, found[0], version) == []
    params, where = locate(WheelSource(found[0]), m2d.SSU_TARGET)
    assert "ssu_dispatch.py" in where and "imported into sglang/srt/layers/attention/mamba/mamba.py" in where
    assert params[: len(m2d.SSU_PARAMS)] == m2d.SSU_PARAMS
