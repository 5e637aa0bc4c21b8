"""Prefix caching with SGLang's ``extra_buffer`` strategy on the replay ring, on CPU.

Real SGLang 0.5.17: ``HybridReqToTokenPool`` / ``MambaPool`` built with
``enable_mamba_extra_buffer`` (ping-pong track slots; the pool seam attaches a standard-decode
ring), SGLang's own decode track copies (``track_mamba_states_if_needed`` per layer as
``Mamba2AttnBackend.forward`` calls it, ``track_mamba_states_all_layers`` once as the GDN
backend calls it; Triton kernels in the CPU interpreter) patched by ``patches/prefix_track.py``,
the result processor's ping-pong swap (``SchedulerBatchResultProcessor._mamba_prefix_cache_update``),
``MambaRadixCache(enable_mamba_extra_buffer=True)`` with a real ``TokenToKVPoolAllocator``, real
``Req`` objects, ``release_kv_cache`` (lifecycle seam), prefix match with the deferred COW
(``ModelRunner._maybe_execute_deferred_mamba_cow_and_clear``), eviction.

Not SGLang here: the model.  Per token id fixed SSM inputs per layer; a decode step is the
decode kernels' references (``mamba2_replay_decode_ref`` / ``gdn_replay_decode_ref``: same ring
writes, read from the row's cursor) under the decode seam's layer context, then the cursor
advance (``_cursor.advance_cursors``); SGLang's extend is stood in for by the fp64 recurrence
written into ``temporal``.  Every state the tree hands back is compared with the plain fp64
recurrence (``mamba2_step_oracle`` / ``gdn_step_oracle``) of the request's tokens.
"""

import os
import types
from array import array
from types import SimpleNamespace

import pytest
import torch

from sglang_replayssm.kernels.gdn_ref import gdn_replay_decode_ref, gdn_step_oracle
from sglang_replayssm.kernels.mamba2_ref import mamba2_replay_decode_ref, mamba2_step_oracle
from sglang_replayssm.patches import gdn_decode, lifecycle, mamba2_decode, prefix_track
from sglang_replayssm.patches import pool as pool_seam
from sglang_replayssm.patches._cursor import LayerContext, ReplayDecodeError, advance_cursors
from sglang_replayssm.patches.registry import apply, unapply_all, verify
from pools import cache_params, hybrid_pool
from seam_env import replayssm_env

L = 4                    # --replayssm-buffer-len
INTERVAL = 8             # --mamba-track-interval
H, P, N, G = 3, 5, 7, 1  # small odd Mamba2 geometry
HK, HV, KD, VD = 1, 3, 5, 7
LAYERS = (0, 2)
MAMBA_SIZE = 16
TOL = 1e-5               # relative error of the fp32 ring path against the fp64 recurrence

_SHIMS = pytest.MonkeyPatch()


@pytest.fixture(autouse=True)
def env(monkeypatch):
    replayssm_env(monkeypatch, L)
    lifecycle.clear_layer_params()
    import sglang.srt.managers.schedule_batch  # noqa: F401  (imported before the patches: see test_spec_slot_reuse)
    import sglang.srt.managers.scheduler_components.batch_result_processor  # noqa: F401
    import sglang.srt.mem_cache.mamba_radix_cache  # noqa: F401
    import sglang.srt.model_executor.model_runner  # noqa: F401

    todo = list(pool_seam.PATCHES) + list(lifecycle.PATCHES) + list(prefix_track.PATCHES)
    apply(todo)
    verify(todo)
    yield monkeypatch
    _SHIMS.undo()
    unapply_all()
    lifecycle.clear_layer_params()


def publish(overlap=True, lazy=False):
    """The server args this path reads (an extra_buffer[_lazy] server, overlap scheduler on)."""
    from sglang.srt import runtime_context
    from sglang.srt.managers import schedule_batch
    from sglang.srt.managers.scheduler_components import batch_result_processor
    from sglang.srt.mem_cache import common

    _SHIMS.setattr(runtime_context.get_context(), "_server_args", SimpleNamespace(
        mamba_cache_chunk_size=64, disable_overlap_schedule=not overlap, disaggregation_mode="null",
        retraction_policy="length", enable_mamba_extra_buffer=lambda: True,
        enable_mamba_extra_buffer_lazy=lambda: lazy))
    for mod in (schedule_batch, common):
        _SHIMS.setattr(mod, "get_serving", lambda: SimpleNamespace(strip_thinking_cache=False), raising=False)
        _SHIMS.setattr(mod, "get_spec", lambda: SimpleNamespace(speculative_algorithm=None), raising=False)
    _SHIMS.setattr(batch_result_processor, "get_exec",
                   lambda: SimpleNamespace(mamba=SimpleNamespace(mamba_track_interval=INTERVAL)))


def make_pool(kind, lazy=False):
    params = cache_params(kind, (H, P, N, G) if kind == "mamba2" else (HK, HV, KD, VD), LAYERS)
    pool = hybrid_pool(
        params, size=6, mamba_size=MAMBA_SIZE, mamba_spec_state_size=4,
        enable_mamba_extra_buffer=True, enable_mamba_extra_buffer_lazy=lazy, speculative_num_draft_tokens=None,
        speculative_eagle_topk=None, enable_overlap_schedule=True, start_layer=0)
    ring = pool.mamba_pool.rssm_ring
    assert ring is not None and ring.kind == kind and ring.spec_window is None
    assert pool.mamba_ping_pong_track_buffer_size == 2
    return pool


# --------------------------------------------------------------------------------------
# the toy model: fixed per-token SSM inputs, fp64 oracle, ring decode under the seam context
# --------------------------------------------------------------------------------------

class Model:
    def __init__(self, pool, seed=0):
        self.gen = torch.Generator().manual_seed(seed)
        self.pool = pool
        self._tok = {}
        self.params = [self.layer_params() for _ in LAYERS]
        mp = pool.mamba_pool
        # random conv windows: SGLang's track copy must carry them into the track slot too
        for c in mp.mamba_cache.conv:
            c.copy_(torch.randn(c.shape, generator=self.gen).to(c.dtype))

    def bf(self, *shape):
        return torch.randn(*shape, generator=self.gen).to(torch.bfloat16).float()

    def token(self, tid):
        if tid not in self._tok:
            self._tok[tid] = [self.token_inputs() for _ in LAYERS]
        return self._tok[tid]

    def oracle(self, tids, states=None):
        """fp64 recurrence over ``tids`` from ``states`` (default: zero); (states, outputs per token)."""
        states = [s.to(torch.float64) for s in (states or self.zero())]
        outs = []
        for tid in tids:
            row = []
            for i, inp in enumerate(self.token(tid)):
                states[i], y = self.step(self.params[i], states[i], inp)
                row.append(y)
            outs.append(row)
        return states, outs

    def zero(self):
        shape = tuple(self.pool.mamba_pool.mamba_cache.temporal.shape[2:])
        return [torch.zeros(shape, dtype=torch.float64) for _ in LAYERS]

    def extend(self, slot, tids, start=None):
        """Stand-in for SGLang's extend (chunked scan): temporal advances, cursors untouched."""
        temporal = self.pool.mamba_pool.mamba_cache.temporal
        states, _ = self.oracle(tids, [temporal[i, slot] for i in range(len(LAYERS))] if start is None else start)
        for i, s in enumerate(states):
            temporal[i, slot] = s.to(temporal.dtype)

    def decode(self, slot, tid, track=None):
        """One decode forward of one row: per layer the ring decode under the seam's layer context
        (and, for a tracked row, SGLang's track copy as the backend calls it), then the cursor
        advance.  ``track``: the track slot of this row when the step is a track boundary."""
        from sglang.srt.layers.attention import hybrid_linear_attn_backend as hlab

        mp = self.pool.mamba_pool
        ring, temporal = mp.rssm_ring, mp.mamba_cache.temporal
        slots = torch.tensor([slot], dtype=torch.int32)
        wp = ring.write_pos[slots.long()].clone()
        mask = torch.tensor([track is not None])
        tidx = torch.tensor([track if track is not None else 0], dtype=torch.int64)
        holder = mamba2_decode._CTX if ring.kind == "mamba2" else gdn_decode._CTX
        out = []
        last = len(LAYERS) - 1
        for i in range(len(LAYERS)):
            ctx = LayerContext(ring_views=ring.layer(i), slots=slots, wp_rows=wp, state_ptr=temporal[i].data_ptr(),
                               num_slots=ring.num_slots, pool_idx=i, layer_id=LAYERS[i])
            holder.set(ctx)
            try:
                if ring.kind == "mamba2":
                    mp_layer = mp.mamba2_layer_cache(i)
                    # SGLang's MambaMixer2.forward runs before the decode: the seam publishes A there
                    prefix_track.mixer_forward_before(SimpleNamespace(A=self.params[i]["A"]))
                    out.append(self.decode_layer(self.params[i], temporal[i], ring.layer(i), self.token(tid)[i],
                                                 slots, wp))
                    hlab.track_mamba_states_if_needed(mp_layer.conv[0], mp_layer.temporal, slots, mask, tidx, 1)
                else:
                    out.append(self.decode_layer(self.params[i], temporal[i], ring.layer(i), self.token(tid)[i],
                                                 slots, wp))
                    if i == last:  # GDN: one all-layers track copy at the last layer
                        hlab.track_mamba_states_all_layers(mp.mamba_cache.conv[0], temporal, slots, mask, tidx, 1)
            finally:
                holder.set(None)
        advance_cursors(ring.write_pos, slots, wp, L)
        return out


class Mamba2Model(Model):
    def layer_params(self):
        return dict(A=-(0.3 + torch.rand(H, generator=self.gen)), dt_bias=0.2 * torch.randn(H, generator=self.gen))

    def token_inputs(self):
        return dict(x=self.bf(H, P), dt=0.5 * torch.randn(H, generator=self.gen), B=self.bf(G, N), C=self.bf(G, N))

    def step(self, prm, state, inp):
        s, y = mamba2_step_oracle(state[None], inp["x"][None], inp["dt"][None], prm["A"], inp["B"][None],
                                  inp["C"][None], dt_bias=prm["dt_bias"])
        return s[0], y[0]

    def decode_layer(self, prm, state, lay, inp, slots, wp):
        y = mamba2_replay_decode_ref(state, lay["x"], lay["B"], lay["dt"], inp["x"][None], inp["dt"][None], prm["A"],
                                     inp["B"][None], inp["C"][None], slots, wp, dt_bias=prm["dt_bias"])
        return y[0]


class GDNModel(Model):
    def layer_params(self):
        return dict(A_log=0.3 * torch.randn(HV, generator=self.gen), dt_bias=0.2 * torch.randn(HV, generator=self.gen))

    def token_inputs(self):
        return dict(qkv=self.bf(2 * HK * KD + HV * VD), a=0.5 * torch.randn(HV, generator=self.gen),
                    b=torch.randn(HV, generator=self.gen))

    def step(self, prm, state, inp):
        o, h = gdn_step_oracle(inp["qkv"][None], inp["a"][None], inp["b"][None], prm["A_log"], prm["dt_bias"],
                               state[None], num_k_heads=HK)
        return h[0], o[0]

    def decode_layer(self, prm, state, lay, inp, slots, wp):
        y = gdn_replay_decode_ref(inp["qkv"][None], inp["a"][None], inp["b"][None], prm["A_log"], prm["dt_bias"],
                                  state, lay["d"], lay["k"], lay["g"], slots, wp)
        return y[0]


def new_model(pool, seed=0):
    return (Mamba2Model if pool.mamba_pool.rssm_ring.kind == "mamba2" else GDNModel)(pool, seed)


def state_err(pool, slot, states64):
    temporal = pool.mamba_pool.mamba_cache.temporal
    return max(float((temporal[i, slot].double() - s).abs().max()) / (float(s.abs().max()) + 1.0)
               for i, s in enumerate(states64))


def out_err(got, ref):
    return max(float((g.double() - r).abs().max()) / (float(r.abs().max()) + 1.0) for g, r in zip(got, ref))


def wp(pool, slot):
    return int(pool.mamba_pool.rssm_ring.write_pos[slot])


def conv_equal(pool, a, b):
    return all(torch.equal(c[:, a], c[:, b]) for c in pool.mamba_pool.mamba_cache.conv)


# --------------------------------------------------------------------------------------
# the scheduler side (SGLang's own code, CPU shims only where it reads config)
# --------------------------------------------------------------------------------------

class Server:
    """One pool + MambaRadixCache(extra_buffer) + the toy model, driven like the scheduler does."""

    def __init__(self, kind, lazy=False):
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.mamba_radix_cache import MambaRadixCache

        publish(overlap=True, lazy=lazy)
        self.lazy = lazy
        self.pool = make_pool(kind, lazy)
        self.model = new_model(self.pool)
        self.kv = TokenToKVPoolAllocator(size=256, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False)
        self.tree = MambaRadixCache(CacheInitParams(disable=False, req_to_token_pool=self.pool,
                                                    token_to_kv_pool_allocator=self.kv, page_size=1,
                                                    enable_mamba_extra_buffer=True,
                                                    enable_mamba_extra_buffer_lazy=lazy))
        self.state = {}   # rid -> fp64 state of the request's committed tokens

    def req(self, rid, tids):
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        return Req(rid, "", array("q", tids), SamplingParams(max_new_tokens=64))

    def admit(self, req, before_cow=None):
        """Prefix match (COW of a hit), req/KV/mamba + ping-pong slots, deferred COW/clear, extend;
        ``before_cow()`` runs between the match (which locks the node) and the deferred COW."""
        from sglang.srt.managers.schedule_batch import ReqKvInfo, ScheduleBatch
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.model_executor.model_runner import ModelRunner

        fill = list(req.origin_input_ids) + list(req.output_ids)
        m = self.tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", fill), req.extra_key), req=req,
                                                     cow_mamba=True))
        req.prefix_indices, req.last_node = m.device_indices, m.last_device_node
        req.cache_protected_len = len(m.device_indices)
        self.tree.inc_lock_ref(req.last_node)
        self.pool.alloc([req])
        n0 = len(m.device_indices)
        self.pool.write((req.req_pool_idx, slice(0, n0)), m.device_indices)
        self.pool.write((req.req_pool_idx, slice(n0, len(fill))), self.kv.alloc(len(fill) - n0))
        req.kv = ReqKvInfo(kv_allocated_len=len(fill), swa_evicted_seqlen=0)
        req.kv_committed_len = len(fill)
        cow = None if req.mamba_cow_src_index is None else int(req.mamba_cow_src_index.reshape(-1)[0])
        slot = int(req.mamba_pool_idx)
        if before_cow is not None:
            before_cow()
        fb = SimpleNamespace(forward_mode=ForwardMode.EXTEND)
        ScheduleBatch._collect_deferred_mamba_cow_and_clear(fb, [req])
        ModelRunner._maybe_execute_deferred_mamba_cow_and_clear(
            SimpleNamespace(req_to_token_pool=self.pool, is_draft_worker=False), fb)
        info = dict(slot=slot, cow=cow, n0=n0, cursor_after_cow=wp(self.pool, slot))
        start = self.model.oracle(fill[:n0])[0]
        info["restored_err"] = state_err(self.pool, slot, start) if cow is not None else 0.0
        self.model.extend(slot, fill[n0:])
        self.state[req.rid] = self.model.oracle(fill)[0]
        return info

    def decode(self, req, tid):
        """prepare_for_decode (track mask / index) + the forward + the result processor's update."""
        from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        req.kv_committed_len += 1
        seq_len = req.kv_committed_len
        self.pool.write((req.req_pool_idx, slice(seq_len - 1, seq_len)), self.kv.alloc(1))
        req.kv.kv_allocated_len += 1
        boundary = seq_len % INTERVAL == 0
        if self.lazy:  # lazy: the second ping-pong slot is allocated only at the boundary
            from sglang.srt.managers.schedule_batch import ScheduleBatch

            ScheduleBatch.mamba_lazy_prealloc_at_boundary(
                SimpleNamespace(reqs=[req], seq_lens_cpu=torch.tensor([seq_len]), req_to_token_pool=self.pool),
                INTERVAL)
        track = int(req.mamba_ping_pong_track_buffer[req.mamba_next_track_idx]) if boundary else None
        got = self.model.decode(int(req.mamba_pool_idx), tid, track=track)
        self.state[req.rid], ref = self.model.oracle([tid], self.state[req.rid])
        req.output_ids.append(tid)
        proc = SimpleNamespace()
        for name in ("_mamba_check_track_boundary", "mamba_lazy_post_decode_at_boundary"):
            setattr(proc, name, types.MethodType(getattr(SchedulerBatchResultProcessor, name), proc))
        batch = SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.NONE, req_to_token_pool=self.pool)
        SchedulerBatchResultProcessor._mamba_prefix_cache_update(proc, req, batch, SimpleNamespace(), 0)
        return dict(track=track, err=out_err(got, ref[0]))

    def finish(self, req, is_insert=True):
        from sglang.srt.mem_cache.common import release_kv_cache

        release_kv_cache(req, self.tree, is_insert=is_insert)


# --------------------------------------------------------------------------------------
# the track copy itself
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("prompt_len,pending", [(5, 3), (4, 0)], ids=["mid-cycle", "flush-boundary"])
def test_track_slot_is_the_materialised_state(kind, prompt_len, pending):
    """The decode that reaches seq_len % interval == 0 mid ring cycle (3 entries pending) or on the
    step that flushes (w == L-1): the track slot holds the fp64 state at seq_len, cursor 0, the conv
    windows of the live slot; the live slot keeps its ring and goes on exactly."""
    srv = Server(kind)
    req = srv.req("a", list(range(1, prompt_len + 1)))
    srv.admit(req)
    live = int(req.mamba_pool_idx)
    steps = []
    for tid in range(100, 100 + INTERVAL - prompt_len):
        steps.append(srv.decode(req, tid))
    track = steps[-1]["track"]
    assert [s["track"] is not None for s in steps] == [False] * (len(steps) - 1) + [True]
    assert req.mamba_last_track_seqlen == INTERVAL
    assert pool_keep(srv.pool, req) == track           # what cache_finished_req / donation will take
    assert state_err(srv.pool, track, srv.state["a"]) < TOL
    assert wp(srv.pool, track) == 0
    assert conv_equal(srv.pool, live, track)
    assert wp(srv.pool, live) == pending               # the live ring is not folded
    if pending:
        assert state_err(srv.pool, live, srv.state["a"]) > 100 * TOL  # its checkpoint lags, as it should
    for tid in range(200, 200 + 2 * L + 1):            # and decodes on exactly
        assert srv.decode(req, tid)["err"] < TOL
    assert max(s["err"] for s in steps) < TOL


def pool_keep(pool, req):
    return int(req.mamba_ping_pong_track_buffer[pool.get_mamba_ping_pong_keep_idx(req)])


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_stale_track_cursor_is_overwritten(kind):
    """A track slot recycled from a request that died mid-cycle carries a stale cursor and ring;
    the track copy sets both from the live slot (a stale cursor would fold garbage)."""
    srv = Server(kind)
    req = srv.req("a", [1, 2, 3, 4, 5])
    srv.admit(req)
    ring = srv.pool.mamba_pool.rssm_ring
    nxt = int(req.mamba_ping_pong_track_buffer[req.mamba_next_track_idx])
    ring.write_pos[nxt] = L - 2
    for t in ring.tensors.values():
        t[:, nxt] = 7.0
    for tid in (11, 12, 13):
        srv.decode(req, tid)
    assert state_err(srv.pool, nxt, srv.state["a"]) < TOL and wp(srv.pool, nxt) == 0


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_untracked_rows_and_padding_are_left_alone(kind):
    """Rows without the mask, padded rows (-1) and the dummy slot 0 neither copy nor fold."""
    srv = Server(kind)
    mp = srv.pool.mamba_pool
    ring = mp.rssm_ring
    srv.model.extend(3, [1, 2])
    ring.write_pos[3] = 2
    ring.write_pos[5] = 1
    before = (mp.mamba_cache.temporal.clone(), ring.write_pos.clone(), {k: v.clone() for k, v in ring.tensors.items()})
    for i in range(len(LAYERS)):
        lifecycle.register_layer_params(ring, i, **({"A": srv.model.params[i]["A"]} if kind == "mamba2" else {}))
    prefix_track.materialize_track(ring, mp, torch.tensor([3, -1, 0]), torch.tensor([False, True, True]),
                                   torch.tensor([5, 6, 7]))
    assert torch.equal(mp.mamba_cache.temporal, before[0]) and torch.equal(ring.write_pos, before[1])
    assert all(torch.equal(v, before[2][k]) for k, v in ring.tensors.items())


def test_spec_ring_is_refused():
    ring = SimpleNamespace(spec_window=3)
    with pytest.raises(ReplayDecodeError, match="no_buffer"):
        prefix_track.materialize_track(ring, None, torch.tensor([1]), torch.tensor([True]), torch.tensor([2]))


def test_outside_a_replay_context_sglang_copies_alone():
    """No decode seam context (a pool without ring, prefill, draft workers): SGLang's copy only."""
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as hlab

    conv = torch.randn(6, 4, 3)
    ssm = torch.randn(6, 2, 3, 3)
    hlab.track_mamba_states_if_needed(conv, ssm, torch.tensor([2, 3]), torch.tensor([True, False]),
                                      torch.tensor([4, 5]), 2)
    assert torch.equal(ssm[4], ssm[2]) and torch.equal(conv[4], conv[2]) and not torch.equal(ssm[5], ssm[3])


# --------------------------------------------------------------------------------------
# the radix tree: insert, hit, evict, retract
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("prompt_len", [5, 4], ids=["mid-cycle", "flush-boundary"])
@pytest.mark.parametrize("lazy", [False, True], ids=["extra_buffer", "extra_buffer_lazy"])
def test_finish_insert_hit_restores_the_prefix(kind, prompt_len, lazy):
    """A decodes past a track boundary (mid ring cycle) and finishes with the overlap scheduler on:
    the tree keeps A's track slot at the track length, the live slot is neither folded nor kept.
    B shares that prefix: the hit restores B's slot as that state with an empty ring (COW), and B
    decodes on exactly, crossing a flush and the next track boundary."""
    srv = Server(kind, lazy)
    mp = srv.pool.mamba_pool
    a = srv.req("a", list(range(1, prompt_len + 1)))
    srv.admit(a)
    for tid in range(100, 100 + INTERVAL - prompt_len + 3):   # 3 tokens past the boundary
        srv.decode(a, tid)
    tracked = pool_keep(srv.pool, a)
    live = int(a.mamba_pool_idx)
    assert wp(srv.pool, live) != 0 or prompt_len == 4
    live_ck = mp.mamba_cache.temporal[:, live].clone()
    tokens = list(a.origin_input_ids) + list(a.output_ids)
    srv.finish(a)   # overlap on, published: the lifecycle fold must not run (nor refuse)
    assert torch.equal(mp.mamba_cache.temporal[:, live], live_ck)
    node = srv.tree.root_node.children[tokens[0]]
    assert len(node.key) == INTERVAL and int(node.mamba_value[0]) == tracked
    assert wp(srv.pool, tracked) == 0
    assert state_err(srv.pool, tracked, srv.model.oracle(tokens[:INTERVAL])[0]) < TOL
    assert srv.pool.mamba_allocator.available_size() == MAMBA_SIZE - 1

    b = srv.req("b", tokens[:INTERVAL] + [50, 51])
    info = srv.admit(b)
    assert info["cow"] == tracked and info["n0"] == INTERVAL
    assert info["cursor_after_cow"] == 0 and info["restored_err"] < TOL
    errs = [srv.decode(b, tid)["err"] for tid in range(300, 300 + INTERVAL)]
    assert max(errs) < TOL
    # B's own track boundary (seq_len 16, after token 305) is again the exact state
    assert b.mamba_last_track_seqlen == 2 * INTERVAL
    assert state_err(srv.pool, pool_keep(srv.pool, b),
                     srv.model.oracle(tokens[:INTERVAL] + [50, 51] + list(range(300, 306)))[0]) < TOL


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_evicted_slot_reused_as_track_slot(kind):
    """The tree's state is evicted under memory pressure (the whole tree); its slot comes back as a
    live or track slot of the next request, whose tracked state is again exact."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    srv = Server(kind)
    a = srv.req("a", [1, 2, 3, 4, 5])
    srv.admit(a)
    for tid in range(100, 106):
        srv.decode(a, tid)
    srv.finish(a)
    cached = int(srv.tree.root_node.children[1].mamba_value[0])
    srv.tree.evict(EvictParams(num_tokens=256, mamba_num=MAMBA_SIZE))
    assert srv.tree.mamba_evictable_size() == 0 and not srv.tree.root_node.children
    assert srv.pool.mamba_allocator.available_size() == MAMBA_SIZE
    # the next request gets exactly the evicted slot and two others; make them all look recycled
    ring = srv.pool.mamba_pool.rssm_ring
    held = srv.pool.mamba_allocator.alloc(MAMBA_SIZE)
    back = [cached] + [int(x) for x in held if int(x) != cached][:2]
    srv.pool.mamba_allocator.free(torch.tensor(back, dtype=held.dtype))
    for s in back:
        ring.write_pos[s] = L - 2
        for t in ring.tensors.values():
            t[:, s] = 3.0
    c = srv.req("c", [9, 8, 7, 6, 5])
    info = srv.admit(c)
    assert info["cow"] is None and wp(srv.pool, int(c.mamba_pool_idx)) == 0   # the deferred clear
    slots = [int(c.mamba_pool_idx)] + [int(x) for x in c.mamba_ping_pong_track_buffer]
    assert sorted(slots) == sorted(back)
    for tid in range(400, 403):
        assert srv.decode(c, tid)["err"] < TOL
    track = pool_keep(srv.pool, c)
    assert track in back and state_err(srv.pool, track, srv.state["c"]) < TOL and wp(srv.pool, track) == 0


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_retract_request_holding_a_cached_prefix(kind):
    """B holds A's cached prefix (locked) and is retracted mid ring cycle
    (``release_kv_cache(is_insert=False)``): nothing is folded or cached, B's slots are freed,
    the tree's state is untouched and unlocked; B re-admitted restores it again and decodes on exactly."""
    srv = Server(kind)
    mp = srv.pool.mamba_pool
    a = srv.req("a", [1, 2, 3, 4, 5])
    srv.admit(a)
    for tid in range(100, 106):
        srv.decode(a, tid)
    tokens = list(a.origin_input_ids) + list(a.output_ids)
    srv.finish(a)
    node = srv.tree.root_node.children[1]
    cached = int(node.mamba_value[0])
    cached_ck = mp.mamba_cache.temporal[:, cached].clone()
    b = srv.req("b", tokens[:INTERVAL] + [60, 61, 62])
    srv.admit(b)
    assert node.mamba_lock_ref > 0
    for tid in (70, 71):
        srv.decode(b, tid)
    b_live = int(b.mamba_pool_idx)
    assert wp(srv.pool, b_live) == 2
    b_ck = mp.mamba_cache.temporal[:, b_live].clone()
    free_before = srv.pool.mamba_allocator.available_size()
    srv.finish(b, is_insert=False)   # what ScheduleBatch.retract_decode's release_req does
    b.reset_for_retract()
    assert b.mamba_pool_idx is None and b.mamba_ping_pong_track_buffer is None
    assert srv.pool.mamba_allocator.available_size() == free_before + 3
    assert torch.equal(mp.mamba_cache.temporal[:, b_live], b_ck)           # not folded
    assert torch.equal(mp.mamba_cache.temporal[:, cached], cached_ck) and wp(srv.pool, cached) == 0
    assert node.mamba_lock_ref == 0 and len(srv.tree.root_node.children) == 1
    info = srv.admit(b)
    assert info["cow"] == cached and info["restored_err"] < TOL and info["cursor_after_cow"] == 0
    assert max(srv.decode(b, tid)["err"] for tid in range(80, 80 + L + 2)) < TOL


# --------------------------------------------------------------------------------------
# wiring
# --------------------------------------------------------------------------------------

def test_served_with_the_ring_and_extra_buffer_on_by_default():
    """The track seams are served with the replay-ring seams; the launcher takes extra_buffer by default, with
    speculative decoding too, and refuses it with --replayssm-extra-buffer false."""
    from types import SimpleNamespace

    from sglang_replayssm.config import ReplaySSMConfig
    from sglang_replayssm.patches import replay_ring_patches, server_args

    assert {p.target for p in prefix_track.PATCHES} <= {p.target for p in replay_ring_patches()}
    args = SimpleNamespace(mamba_radix_cache_strategy="extra_buffer", tp_size=1, pp_size=1)
    off, on = ReplaySSMConfig(enable=True, extra_buffer=False), ReplaySSMConfig(enable=True)
    assert any("--replayssm-extra-buffer false" in r for r in server_args.unsupported_reasons(args, off))
    assert not any("extra_buffer" in r for r in server_args.unsupported_reasons(args, on))
    spec = SimpleNamespace(**vars(args), speculative_algorithm="NEXTN", speculative_eagle_topk=1,
                           speculative_num_steps=3, speculative_num_draft_tokens=4)
    assert not any("extra_buffer" in r for r in server_args.unsupported_reasons(spec, on))


def test_lifecycle_skips_the_fold_for_extra_buffer_trees():
    """The finish of an extra_buffer tree never folds the live slot, even with overlap published on."""
    publish(overlap=True)
    pool = make_pool("mamba2")
    ring = pool.mamba_pool.rssm_ring
    ring.write_pos[3] = 2
    tree = SimpleNamespace(req_to_token_pool=pool, supports_mamba=lambda: True, disable=False,
                           enable_mamba_extra_buffer=True)
    req = SimpleNamespace(req_pool_idx=0, kv=SimpleNamespace(), mamba_pool_idx=torch.tensor(3),
                          skip_radix_cache_insert=False)
    assert lifecycle.release_kv_cache_before(req, tree) is None
    assert int(ring.write_pos[3]) == 2
    tree.enable_mamba_extra_buffer = False   # no_buffer under overlap: still refused, as before
    with pytest.raises(lifecycle.LifecycleError, match="overlap"):
        lifecycle.release_kv_cache_before(req, tree)


@pytest.mark.parametrize("version", ["0.5.15", "0.5.23"])
def test_targets_exist_in_other_releases(version):
    from sglang_wheels import wheel_for

    from sglang_replayssm.patches.registry import applicable
    from sglang_replayssm.patches.source_check import check

    todo = applicable(prefix_track.PATCHES, version)
    assert {p.target for p in todo} >= {prefix_track.TRACK_TARGET, prefix_track.MIXER_TARGET,
                                        prefix_track.TRACK_EXTEND_TARGET}
    problems = check(todo, wheel_for(version), version)
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_prefill_track_slots_read_flushed(kind):
    """SGLang's prefill track (``_track_mamba_state_extend``: chunk-boundary ``h`` or the final state
    into the track slots) writes exact checkpoints; slots recycled with a stale cursor get cursor 0,
    other slots keep theirs."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import MambaAttnBackendBase

    publish()
    pool = make_pool(kind)
    mp = pool.mamba_pool
    ring = mp.rssm_ring
    temporal = mp.mamba_cache.temporal
    temporal.copy_(torch.randn(temporal.shape))
    ring.write_pos[[4, 6, 7, 9]] = torch.tensor([2, 1, 2, 3], dtype=torch.int32)
    h = torch.randn((1, 3) + tuple(temporal.shape[2:]))
    md = SimpleNamespace(has_mamba_track_mask=True, track_ssm_h_src=torch.tensor([1]),
                         track_ssm_h_dst=torch.tensor([6]), track_ssm_final_src=torch.tensor([2]),
                         track_ssm_final_dst=torch.tensor([4]),
                         track_ssm_recompute_dst=torch.tensor([7]))   # 0.5.23's recomputed track states
    backend = SimpleNamespace(req_to_token_pool=pool)
    for i in range(len(LAYERS)):
        MambaAttnBackendBase._track_mamba_state_extend(backend, None, h, temporal[i], md)
    assert torch.equal(temporal[:, 4], temporal[:, 2]) and torch.equal(temporal[-1, 6], h[0, 1])
    assert wp(pool, 4) == 0 and wp(pool, 6) == 0 and wp(pool, 7) == 0 and wp(pool, 9) == 3


def test_per_layer_copier_fallback(monkeypatch):
    """SGLang 0.5.15 has only the per-layer track copier: the ring rows are copied layer by layer."""
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as hlab

    srv = Server("mamba2")
    req = srv.req("a", [1, 2, 3, 4, 5])
    srv.admit(req)
    with monkeypatch.context() as m:
        m.setattr(hlab, "track_mamba_states_all_layers", None)
        copier = prefix_track.default_row_copier()
        assert copier.__name__ == "copy_all"
        for tid in (11, 12, 13):
            srv.decode(req, tid)
    track = pool_keep(srv.pool, req)
    assert state_err(srv.pool, track, srv.state["a"]) < TOL and wp(srv.pool, track) == 0


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_memory_pressure_cannot_evict_a_prefix_being_read(kind):
    """Between B's match and its deferred COW the whole tree is asked to go: the node B reads is
    locked and stays, its state is intact; once B is gone it can be evicted."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    srv = Server(kind)
    a = srv.req("a", [1, 2, 3, 4, 5])
    srv.admit(a)
    for tid in range(100, 106):
        srv.decode(a, tid)
    tokens = list(a.origin_input_ids) + list(a.output_ids)
    srv.finish(a)
    node = srv.tree.root_node.children[1]
    evicted = []
    b = srv.req("b", tokens[:INTERVAL] + [60])
    info = srv.admit(b, before_cow=lambda: evicted.append(
        srv.tree.evict(EvictParams(num_tokens=256, mamba_num=MAMBA_SIZE))))
    assert srv.tree.root_node.children.get(1) is node and node.mamba_value is not None
    assert info["cow"] == int(node.mamba_value[0]) and info["restored_err"] < TOL
    assert max(srv.decode(b, tid)["err"] for tid in range(90, 95)) < TOL
    srv.finish(b, is_insert=False)
    srv.tree.evict(EvictParams(num_tokens=256, mamba_num=MAMBA_SIZE))
    assert not srv.tree.root_node.children
    assert srv.pool.mamba_allocator.available_size() == MAMBA_SIZE


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("is_insert", [True, False], ids=["finish-abort", "release"])
def test_abort_during_a_cached_prefill(kind, is_insert):
    """B hits A's prefix and is aborted right after its prefill, before any decode or track step:
    nothing new is cached (no tracked state), nothing is folded, B's slots are freed, the tree's
    state is intact and serves the next hit."""
    srv = Server(kind)
    mp = srv.pool.mamba_pool
    a = srv.req("a", [1, 2, 3, 4, 5])
    srv.admit(a)
    for tid in range(100, 106):
        srv.decode(a, tid)
    tokens = list(a.origin_input_ids) + list(a.output_ids)
    srv.finish(a)
    node = srv.tree.root_node.children[1]
    cached = int(node.mamba_value[0])
    cached_ck = mp.mamba_cache.temporal[:, cached].clone()
    b = srv.req("b", tokens[:INTERVAL] + [60, 61])
    srv.admit(b)
    assert b.mamba_last_track_seqlen is None
    srv.finish(b, is_insert=is_insert)
    assert b.mamba_pool_idx is None and srv.pool.mamba_allocator.available_size() == MAMBA_SIZE - 1
    assert list(srv.tree.root_node.children) == [1] and len(node.key) == INTERVAL and not node.children
    assert torch.equal(mp.mamba_cache.temporal[:, cached], cached_ck) and wp(srv.pool, cached) == 0
    c = srv.req("c", tokens[:INTERVAL] + [70])
    info = srv.admit(c)
    assert info["cow"] == cached and info["restored_err"] < TOL
