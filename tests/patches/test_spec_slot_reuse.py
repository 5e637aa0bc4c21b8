"""Slot reuse on a SPEC ring (ring length L + T, cursors write_pos / origin / flush), on CPU.

Real SGLang 0.5.17: ``HybridReqToTokenPool`` / ``MambaPool`` built for a speculating server
(the pool seam attaches a spec ring), the deferred clear / COW of
``ModelRunner._maybe_execute_deferred_mamba_cow_and_clear`` (collected by
``ScheduleBatch._collect_deferred_mamba_cow_and_clear``), ``MambaRadixCache`` with a real
``TokenToKVPoolAllocator``, real ``Req`` objects, ``release_kv_cache`` (lifecycle seam: the
finish fold) and ``ScheduleBatch.retract_decode`` (``release_kv_cache(is_insert=False)``).

Not SGLang here: the model (Mamba2 and GDN pools, small odd geometries).  Each token id has
fixed random SSM inputs per layer; a verify of a window runs ``mamba2_verify_ref`` /
``gdn_verify_ref`` (the verify kernels' references: same cursor rules, same ring writes) and
the commit ``spec_commit`` (the cursor kernel); rejected drafts are junk tokens whose ring
entries must stay masked.  SGLang's extend (chunked scan, which writes ``temporal`` only and
never a cursor) is stood in for by the fp64 recurrence written into ``temporal``.  Every
window output and every checkpoint is compared with the plain fp64 recurrence
(``mamba2_step_oracle`` / ``gdn_step_oracle``) of the tokens the request really committed.

The core check of each scenario is numeric; :func:`test_a_stale_spec_cursor_is_caught`
re-runs the scenarios with the cursor reset of spec rings switched off and asserts that
the check then fails.
"""

import os
from array import array
from types import SimpleNamespace

import pytest
import torch

from sglang_replayssm.kernels.gdn_ref import gdn_step_oracle
from sglang_replayssm.kernels.gdn_verify_ref import gdn_verify_ref
from sglang_replayssm.kernels.mamba2_ref import mamba2_step_oracle
from sglang_replayssm.kernels.mamba2_verify_ref import mamba2_verify_ref
from sglang_replayssm.kernels.spec_cursor import check_spec_cursors, spec_commit
from sglang_replayssm.patches import lifecycle
from sglang_replayssm.patches import pool as pool_seam
from sglang_replayssm.patches.registry import apply, unapply_all, verify
from sglang_replayssm.ring import ReplayRing
from pools import cache_params, hybrid_pool
from seam_env import replayssm_env

L = 5                   # history block B (--replayssm-buffer-len)
T = 3                   # verify window (speculative_num_draft_tokens): ring length R = 8
H, P, N, G = 3, 5, 7, 1  # small odd Mamba2 geometry
HK, HV, KD, VD = 1, 3, 5, 7  # small odd GDN geometry (k heads, v heads, head k dim, head v dim)
LAYERS = (0, 2)
MAMBA_SIZE = 6
TOL = 1e-5              # relative error of the fp32 ring path against the fp64 recurrence
MID_CYCLE = [2, 3, 2, 2]  # accepts that leave wp=4, origin=5, flush=1 (a wrapped ring)


# --------------------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------------------

_SHIMS = pytest.MonkeyPatch()   # scenario-level shims, undone after every test by ``env``


@pytest.fixture(autouse=True)
def env(monkeypatch):
    replayssm_env(monkeypatch, L)
    if not torch.cuda.is_available():  # MambaPool allocates its conv windows with device="cuda"
        orig = pool_seam._SnapshotFreeTorch.zeros
        monkeypatch.setattr(pool_seam._SnapshotFreeTorch, "zeros",
                            lambda self, *a, **k: orig(self, *a, **({**k, "device": "cpu"}
                                                                     if k.get("device") == "cuda" else k)))
    unapply_all()
    lifecycle.clear_layer_params()
    # the modules that import release_kv_cache by name are imported before the patches: a module
    # first imported while patched would keep the wrapper after unapply_all (registry rule)
    import sglang.srt.managers.schedule_batch  # noqa: F401
    import sglang.srt.managers.scheduler_components.batch_result_processor  # noqa: F401
    import sglang.srt.mem_cache.mamba_radix_cache  # noqa: F401
    import sglang.srt.model_executor.model_runner  # noqa: F401

    todo = list(pool_seam.PATCHES) + list(lifecycle.PATCHES)
    apply(todo)
    verify(todo)
    yield monkeypatch
    _SHIMS.undo()
    unapply_all()
    lifecycle.clear_layer_params()


def make_spec_pool(kind):
    """The pool SGLang builds for a speculating server with T draft tokens (0.5.17 signature);
    GDN cache params as ``Qwen3NextConfig.mamba2_cache_params`` builds them."""
    params = cache_params(kind, (H, P, N, G) if kind == "mamba2" else (HK, HV, KD, VD), LAYERS)
    pool = hybrid_pool(
        params, size=4, mamba_size=MAMBA_SIZE, mamba_spec_state_size=4,
        enable_mamba_extra_buffer=False, speculative_num_draft_tokens=T, speculative_eagle_topk=1,
        enable_overlap_schedule=False, start_layer=0)
    ring = pool.mamba_pool.rssm_ring
    assert ring is not None and ring.kind == kind and ring.spec_window == T and ring.ring_len == L + T
    return pool


# --------------------------------------------------------------------------------------
# the toy model: fixed per-token SSM inputs, fp64 oracle, ring verify + commit
# --------------------------------------------------------------------------------------

class Model:
    """The toy model of one pool: per layer parameters, per token id fixed SSM inputs, the fp64
    oracle, SGLang's extend (stand-in) and a target verify + commit on the spec ring.

    Activations are rounded to bf16 up front (the ring's activation dtype without a published
    ModelConfig), so the ring stores them exactly and the fp64 oracle sees the same values."""

    def __init__(self, pool, seed=0):
        self.gen = torch.Generator().manual_seed(seed)
        self.pool = pool
        self._tok = {}
        self.params = [self.layer_params() for _ in LAYERS]
        ring = pool.mamba_pool.rssm_ring
        for i, prm in enumerate(self.params):  # what the decode seams publish for the finish fold
            lifecycle.register_layer_params(ring, i, **self.fold_params(prm))

    def bf(self, *shape):
        return torch.randn(*shape, generator=self.gen).to(torch.bfloat16).float()

    def token(self, tid):
        if tid not in self._tok:
            self._tok[tid] = [self.token_inputs() for _ in LAYERS]
        return self._tok[tid]

    def oracle(self, states, tids):
        """fp64 recurrence over ``tids`` from ``states`` (per layer); (states, outputs per token)."""
        outs = []
        states = [s.to(torch.float64) for s in states]
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

    def extend(self, slot, tids):
        """Stand-in for SGLang's extend (chunked scan): temporal advances, cursors untouched."""
        temporal = self.pool.mamba_pool.mamba_cache.temporal
        states, _ = self.oracle([temporal[i, slot] for i in range(len(LAYERS))], tids)
        for i, s in enumerate(states):
            temporal[i, slot] = s.to(temporal.dtype)

    def verify(self, slot, tids, accepted):
        """One target verify of window ``tids`` on ``slot`` (the kernel's reference, reading the
        slot's cursors) + the commit of ``accepted`` tokens; the window outputs per token per layer."""
        mp = self.pool.mamba_pool
        ring, temporal = mp.rssm_ring, mp.mamba_cache.temporal
        idx = torch.tensor([slot])
        outs = [[None] * len(LAYERS) for _ in tids]
        for i in range(len(LAYERS)):
            toks = [self.token(t)[i] for t in tids]
            stack = {k: torch.stack([tk[k] for tk in toks])[None] for k in toks[0]}
            y = self.verify_layer(self.params[i], temporal[i], ring.layer(i), stack, idx, ring.verify_cursors)
            for t in range(len(tids)):
                outs[t][i] = y[0, t]
        spec_commit(*ring.verify_cursors, idx, torch.tensor([accepted]), window=ring.spec_window,
                    ring_len=ring.ring_len)
        return outs


class Mamba2Model(Model):
    def layer_params(self):
        return dict(A=-(0.3 + torch.rand(H, generator=self.gen)), dt_bias=0.2 * torch.randn(H, generator=self.gen))

    def fold_params(self, prm):
        return dict(A=prm["A"])

    def token_inputs(self):
        return dict(x=self.bf(H, P), dt=0.5 * torch.randn(H, generator=self.gen), B=self.bf(G, N), C=self.bf(G, N))

    def step(self, prm, state, inp):
        s, y = mamba2_step_oracle(state[None], inp["x"][None], inp["dt"][None], prm["A"], inp["B"][None],
                                  inp["C"][None], dt_bias=prm["dt_bias"])
        return s[0], y[0]

    def verify_layer(self, prm, state, lay, w, idx, cursors):
        return mamba2_verify_ref(state, lay["x"], lay["B"], lay["dt"], w["x"], w["dt"], prm["A"], w["B"], w["C"],
                                 idx, *cursors, dt_bias=prm["dt_bias"])


class GDNModel(Model):
    def layer_params(self):
        return dict(A_log=0.3 * torch.randn(HV, generator=self.gen), dt_bias=0.2 * torch.randn(HV, generator=self.gen))

    def fold_params(self, prm):
        return dict(use_qk_l2norm=True)

    def token_inputs(self):
        return dict(qkv=self.bf(2 * HK * KD + HV * VD), a=0.5 * torch.randn(HV, generator=self.gen),
                    b=torch.randn(HV, generator=self.gen))

    def step(self, prm, state, inp):
        o, h = gdn_step_oracle(inp["qkv"][None], inp["a"][None], inp["b"][None], prm["A_log"], prm["dt_bias"],
                               state[None], num_k_heads=HK)
        return h[0], o[0]

    def verify_layer(self, prm, state, lay, w, idx, cursors):
        return gdn_verify_ref(w["qkv"], w["a"], w["b"], prm["A_log"], prm["dt_bias"], state, lay["d"], lay["k"],
                              lay["g"], idx, *cursors)


def new_model(pool, seed=0):
    return (Mamba2Model if pool.mamba_pool.rssm_ring.kind == "mamba2" else GDNModel)(pool, seed)


def rel_err(got, ref):
    num = max(float((g.double() - r).abs().max()) for gs, rs in zip(got, ref) for g, r in zip(gs, rs))
    den = max(float(r.abs().max()) for rs in ref for r in rs)
    return num / (den + 1.0)


class Stream:
    """A request's committed token stream on one slot, checked against the fp64 oracle."""

    def __init__(self, model, slot, state64, seed):
        self.model, self.slot, self.state = model, slot, state64
        self.gen = torch.Generator().manual_seed(seed)
        self.committed = []
        self.errors = []
        self.outs = []

    def step(self, accepted, width=T):
        """A verify window of ``width`` tokens: ``accepted`` true tokens then rejected drafts (junk
        token ids).  ``width=1, accepted=1`` is a plain decode step on the spec ring (what the decode
        seams run for a request that is not speculating: a verify of one token)."""
        ids = torch.randint(1000, 10 ** 6, (width,), generator=self.gen).tolist()
        got = self.model.verify(self.slot, ids, accepted)
        self.outs.append(got)
        _, ref = self.model.oracle(self.state, ids)
        self.errors.append(rel_err(got, ref))
        self.state, _ = self.model.oracle(self.state, ids[:accepted])
        self.committed += ids[:accepted]
        return ids[:accepted]

    def run(self, accepts):
        """Verify windows with these accept counts; 0 stands for a plain one-token decode step."""
        for a in accepts:
            self.step(a) if a else self.step(1, width=1)
        return self

    def worst(self):
        return max(self.errors)


def cursors(pool, slot):
    ring = pool.mamba_pool.rssm_ring
    return int(ring.write_pos[slot]), int(ring.origin[slot]), int(ring.flush[slot])


def checkpoint_err(pool, slot, state64):
    temporal = pool.mamba_pool.mamba_cache.temporal
    return max(float((temporal[i, slot].double() - s).abs().max()) / (float(s.abs().max()) + 1.0)
               for i, s in enumerate(state64))


def deferred_cow_and_clear(pool, reqs):
    """What the scheduler and the model runner do before an extend: SGLang's own code."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.model_runner import ModelRunner

    fb = SimpleNamespace(forward_mode=ForwardMode.EXTEND)
    ScheduleBatch._collect_deferred_mamba_cow_and_clear(fb, reqs)
    ModelRunner._maybe_execute_deferred_mamba_cow_and_clear(
        SimpleNamespace(req_to_token_pool=pool, is_draft_worker=False), fb)


def make_req(rid, tids, max_new_tokens=64):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    return Req(rid, "", array("q", tids), SamplingParams(max_new_tokens=max_new_tokens))


# --------------------------------------------------------------------------------------
# scenarios (each returns what its test asserts; the mutation test re-runs them)
# --------------------------------------------------------------------------------------

def scenario_clear(kind):
    """Slot 3 mid-cycle (wrapped, flush pending), slot 5 mid-cycle; the deferred clear of a
    fresh request that got slot 3; then a fresh stream on slot 3 from the zero state."""
    pool = make_spec_pool(kind)
    model = new_model(pool)
    model.extend(3, [1, 2, 3])
    model.extend(5, [4, 5])
    Stream(model, 3, model.oracle(model.zero(), [1, 2, 3])[0], 11).run(MID_CYCLE)
    Stream(model, 5, model.oracle(model.zero(), [4, 5])[0], 12).run([3, 1])
    before = {3: cursors(pool, 3), 5: cursors(pool, 5)}
    req = SimpleNamespace(mamba_cow_src_index=None, mamba_needs_clear=True, mamba_pool_idx=torch.tensor(3))
    deferred_cow_and_clear(pool, [req])
    after = {3: cursors(pool, 3), 5: cursors(pool, 5)}
    zero_ck = float(pool.mamba_pool.mamba_cache.temporal[:, 3].abs().max())
    model.extend(3, [7, 8])   # the new request's prefill, from the cleared (zero) checkpoint
    fresh = Stream(model, 3, model.oracle(model.zero(), [7, 8])[0], 13)
    fresh.run([1, 3, 0, 2, 3, 0, 0, 2, 1])  # verifies and plain decodes; crosses flushes
    ring = pool.mamba_pool.rssm_ring
    check_spec_cursors(*ring.verify_cursors, window=T, ring_len=ring.ring_len, slots=[3, 5])
    lifecycle.fold_slots(pool.mamba_pool, torch.tensor([3]))
    return dict(before=before, after=after, zero_ck=zero_ck, err=fresh.worst(),
                fold_err=checkpoint_err(pool, 3, fresh.state), folded=cursors(pool, 3))


def scenario_copy(kind):
    """COW: source slot 2 folded (as the finish fold leaves a tree node's slot), destination
    slot 4 a stale mid-cycle slot; the deferred COW copies 2 -> 4 (debug check on)."""
    pool = make_spec_pool(kind)
    model = new_model(pool)
    mp = pool.mamba_pool
    ring = mp.rssm_ring
    model.extend(2, [1, 2])
    src = Stream(model, 2, model.oracle(model.zero(), [1, 2])[0], 21).run(MID_CYCLE + [3])
    model.extend(4, [9])
    Stream(model, 4, model.oracle(model.zero(), [9])[0], 22).run(MID_CYCLE)
    src_mid = cursors(pool, 2)
    lifecycle.fold_slots(mp, torch.tensor([2]))
    fold_err = checkpoint_err(pool, 2, src.state)
    dst_before = cursors(pool, 4)
    snap = dict(temporal=mp.mamba_cache.temporal[:, 2].clone(), cursors=cursors(pool, 2),
                ring={k: v[:, 2].clone() for k, v in ring.tensors.items()})
    mp.debug_memory_pool = True  # SGLANG_DEBUG_MEMORY_POOL: the hook checks the source is flushed
    req = SimpleNamespace(mamba_cow_src_index=torch.tensor([2]), mamba_needs_clear=False,
                          mamba_pool_idx=torch.tensor(4))
    deferred_cow_and_clear(pool, [req])
    src_same = (torch.equal(mp.mamba_cache.temporal[:, 2], snap["temporal"]) and cursors(pool, 2) == snap["cursors"]
                and all(torch.equal(v[:, 2], snap["ring"][k]) for k, v in ring.tensors.items()))
    copied = torch.equal(mp.mamba_cache.temporal[:, 4], mp.mamba_cache.temporal[:, 2])
    dst_after = cursors(pool, 4)
    # both continue with the same windows: identical, and equal to the oracle of the source's tokens
    dst = Stream(model, 4, src.state, 23).run([2, 3, 3, 1, 2])
    cont = Stream(model, 2, src.state, 23).run([2, 3, 3, 1, 2])
    same = all(torch.equal(a, b) for x, y in zip(dst.outs, cont.outs) for xs, ys in zip(x, y)
               for a, b in zip(xs, ys))
    return dict(src_mid=src_mid, fold_err=fold_err, dst_before=dst_before, dst_after=dst_after,
                src_same=src_same, copied=copied, err=dst.worst(), src_err=cont.worst(), same=same)


def scenario_retract(kind, mode="retract"):
    """MambaRadixCache holds request A's finished sequence (folded on finish); request B matches it
    (COW) and decodes to mid-cycle; ``ScheduleBatch.retract_decode`` then retracts B (``mode``
    "retract": a longer request is kept) or aborts it (``mode`` "abort": B alone does not fit,
    SGLang's out-of-memory abort).  Both release through ``release_kv_cache(is_insert=False)``.
    Then the same token sequence is admitted again (B re-admitted, or a new request C after the
    abort) onto B's stale slot: COW from the tree, extend of the tokens past the prefix, verify."""
    from sglang.srt import runtime_context
    from sglang.srt.managers.schedule_batch import ReqKvInfo, ScheduleBatch
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.common import release_kv_cache
    from sglang.srt.mem_cache.mamba_radix_cache import MambaRadixCache
    from sglang.srt.mem_cache.radix_cache import RadixKey

    pool = make_spec_pool(kind)
    model = new_model(pool)
    mp = pool.mamba_pool
    kv_alloc = TokenToKVPoolAllocator(size=256, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False)
    _SHIMS.setattr(runtime_context.get_context(), "_server_args", SimpleNamespace(
        mamba_cache_chunk_size=64, disable_overlap_schedule=True, disaggregation_mode="null",
        retraction_policy="length"))
    # CPU shim: the config namespaces a scheduler publishes, as far as this path reads them
    # (an EAGLE server that does not strip thinking from the cache)
    from sglang.srt.managers import schedule_batch
    from sglang.srt.mem_cache import common

    for mod in (schedule_batch, common):
        _SHIMS.setattr(mod, "get_spec", lambda: SimpleNamespace(speculative_algorithm="EAGLE"))
        _SHIMS.setattr(mod, "get_serving", lambda: SimpleNamespace(strip_thinking_cache=False))
    tree = MambaRadixCache(CacheInitParams(disable=False, req_to_token_pool=pool,
                                           token_to_kv_pool_allocator=kv_alloc, page_size=1))
    out = {}

    def admit(req, fill):
        """Scheduler: prefix match (COW), req/KV slots, deferred COW/clear, extend of the rest."""
        key = RadixKey(array("q", fill), req.extra_key)
        m = tree.match_prefix(MatchPrefixParams(key=key, req=req, cow_mamba=True))
        req.prefix_indices, req.last_node = m.device_indices, m.last_device_node
        req.cache_protected_len = len(m.device_indices)
        tree.inc_lock_ref(req.last_node)
        pool.alloc([req])
        n0 = len(m.device_indices)
        pool.write((req.req_pool_idx, slice(0, n0)), m.device_indices)
        pool.write((req.req_pool_idx, slice(n0, len(fill))), kv_alloc.alloc(len(fill) - n0))
        req.kv = ReqKvInfo(kv_allocated_len=len(fill), swa_evicted_seqlen=0)
        req.kv_committed_len = len(fill)
        slot = int(req.mamba_pool_idx)
        cow = None if req.mamba_cow_src_index is None else int(req.mamba_cow_src_index.reshape(-1)[0])
        stale = cursors(pool, slot)
        deferred_cow_and_clear(pool, [req])
        fresh = cursors(pool, slot)
        start = model.zero() if cow is None else model.oracle(model.zero(), fill[:n0])[0]
        ck_err = checkpoint_err(pool, slot, start)
        model.extend(slot, fill[n0:])
        return dict(slot=slot, cow=cow, n0=n0, stale=stale, fresh=fresh, ck_err=ck_err)

    def decode(req, accepts, seed):
        fill = list(req.origin_input_ids) + list(req.output_ids)
        s = Stream(model, int(req.mamba_pool_idx), model.oracle(model.zero(), fill)[0], seed)
        for a in accepts:
            toks = s.step(a) if a else s.step(1, width=1)
            a = len(toks)
            pool.write((req.req_pool_idx, slice(req.kv_committed_len, req.kv_committed_len + a)), kv_alloc.alloc(a))
            req.output_ids.extend(toks)
            req.kv_committed_len += a
            req.kv.kv_allocated_len += a
        return s

    # request A: prefill, decode, finish -> its slot is donated to the tree (folded first)
    a = make_req("a", [1, 2, 3, 4, 5])
    out["a_admit"] = admit(a, [1, 2, 3, 4, 5])
    sa = decode(a, MID_CYCLE + [1], 31)
    a_slot = int(a.mamba_pool_idx)
    out["a_mid"] = cursors(pool, a_slot)
    release_kv_cache(a, tree)  # finish: lifecycle fold, then MambaRadixCache.cache_finished_req
    out["a_cached_err"] = checkpoint_err(pool, a_slot, sa.state)
    out["a_cached_cursors"] = cursors(pool, a_slot)
    prefix = [1, 2, 3, 4, 5] + sa.committed

    # request B: matches A's sequence, decodes to mid-cycle
    b = make_req("b", prefix + [40, 41])
    out["b_admit"] = admit(b, prefix + [40, 41])
    sb = decode(b, MID_CYCLE, 32)
    out["b_decode_err"] = sb.worst()
    b_slot = int(b.mamba_pool_idx)
    out["b_mid"] = cursors(pool, b_slot)
    b_ck = mp.mamba_cache.temporal[:, b_slot].clone()
    # every other free mamba slot is held, so B's re-admission must reuse B's stale slot
    held = pool.mamba_allocator.alloc(pool.mamba_allocator.available_size())

    # the real ScheduleBatch.retract_decode (memory checks and the batch filter stubbed)
    keep = make_req("keep", [7, 8, 9])
    keep.output_ids = [1] * 20
    batch = object.__new__(ScheduleBatch)
    batch.reqs = [keep, b] if mode == "retract" else [b]
    batch.req_to_token_pool, batch.token_to_kv_pool_allocator = pool, kv_alloc
    batch.tree_cache, batch.hisparse_coordinator = tree, None
    fits = mode == "retract"
    batch.check_decode_mem = lambda selected_indices=None: fits
    kept = []
    batch.filter_batch = lambda keep_indices=None, **kw: kept.append(keep_indices)
    retracted, _, aborted = batch.retract_decode(runtime_context.get_context()._server_args)
    out["retracted"] = [r.rid for r in retracted]
    out["aborted"] = [r.rid for r in aborted]
    out["freed"] = b.mamba_pool_idx is None and b.kv is None
    out["retract_no_fold"] = torch.equal(mp.mamba_cache.temporal[:, b_slot], b_ck)
    out["b_stale"] = cursors(pool, b_slot)

    # re-admission: recompute from the tree's prefix (COW into the reused slot)
    fill = list(b.origin_input_ids) + list(b.output_ids)
    if mode == "abort":
        b = make_req("c", fill)
    out["b_readmit"] = admit(b, fill)
    out["prefix_len"] = len(prefix)
    out["b_slot"] = b_slot
    out["a_slot"] = a_slot
    sb2 = decode(b, [3, 0, 2, 1, 3], 33)
    out["err"] = sb2.worst()
    out["kept"] = kept
    out["tree_slot_err"] = checkpoint_err(pool, a_slot, sa.state)  # the tree's copy source is untouched
    pool.mamba_allocator.free(held)
    return out


# --------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------

KINDS = pytest.mark.parametrize("kind", ["mamba2", "gdn"])


@KINDS
def test_clear_resets_every_spec_cursor_and_decodes_from_zero(kind):
    r = scenario_clear(kind)
    wp, org, fl = r["before"][3]
    assert wp > 0 and org > 0 and fl == 1, f"slot 3 must be mid-cycle before the clear, got {r['before'][3]}"
    assert r["after"][3] == (0, 0, 0)
    assert r["after"][5] == r["before"][5] != (0, 0, 0)   # only the cleared slot
    assert r["zero_ck"] == 0.0                           # SGLang's own clear of temporal ran
    assert r["err"] < TOL, f"verify after clear vs fp64 recurrence from the zero state: {r['err']:.2e}"
    assert r["fold_err"] < TOL and r["folded"] == (0, 0, 0)


@KINDS
def test_copy_gives_the_materialised_state_and_a_fresh_cursor(kind):
    r = scenario_copy(kind)
    assert r["src_mid"][0] > 0 and r["src_mid"][1] > 0, r["src_mid"]
    assert r["fold_err"] < TOL                            # the fold materialised the source exactly
    assert r["dst_before"][0] > 0 and r["dst_before"][1] > 0
    assert r["copied"] and r["dst_after"] == (0, 0, 0)
    assert r["src_same"], "copy_from changed the source slot"
    assert r["err"] < TOL and r["src_err"] < TOL and r["same"]


@KINDS
def test_copy_of_an_unflushed_spec_source_is_refused_in_debug_mode(kind):
    pool = make_spec_pool(kind)
    model = new_model(pool)
    mp = pool.mamba_pool
    model.extend(2, [1])
    Stream(model, 2, model.oracle(model.zero(), [1])[0], 5).run([2])
    mp.debug_memory_pool = True
    with pytest.raises(pool_seam.UnflushedCopyError, match="must be flushed"):
        mp.copy_from(torch.tensor([2]), torch.tensor([4]))


@KINDS
@pytest.mark.parametrize("mode", ["retract", "abort"])
def test_retract_and_readmit_through_the_mamba_radix_cache(kind, mode):
    r = scenario_retract(kind, mode)
    # A: fresh slot cleared, mid-cycle, folded into the tree on finish
    assert r["a_admit"]["cow"] is None and r["a_admit"]["fresh"] == (0, 0, 0)
    assert r["a_mid"][0] > 0 and r["a_mid"][1] > 0
    assert r["a_cached_err"] < TOL and r["a_cached_cursors"] == (0, 0, 0)
    # B: COW from A's tree slot into a fresh slot
    assert r["b_admit"]["cow"] == r["a_slot"] and r["b_admit"]["n0"] == r["prefix_len"]
    assert r["b_admit"]["fresh"] == (0, 0, 0) and r["b_admit"]["ck_err"] < TOL
    assert r["b_decode_err"] < TOL
    # retraction: B released without a fold, its slot freed with stale cursors
    assert (r["retracted"], r["aborted"]) == ((["b"], []) if mode == "retract" else ([], ["b"]))
    assert r["kept"] == ([[0]] if mode == "retract" else [[]])
    assert r["freed"] and r["retract_no_fold"]
    assert r["b_stale"] == r["b_mid"] and r["b_mid"][0] > 0 and r["b_mid"][1] > 0 and r["b_mid"][2] == 1
    # re-admission onto the same (stale) slot: prefix state restored, cursors fresh, decode exact
    ra = r["b_readmit"]
    assert ra["slot"] == r["b_slot"] and ra["cow"] == r["a_slot"] and ra["n0"] == r["prefix_len"]
    assert ra["stale"] == r["b_mid"] and ra["fresh"] == (0, 0, 0)
    assert ra["ck_err"] < TOL, "restored checkpoint vs fp64 recurrence of the cached prefix"
    assert r["err"] < TOL, f"verify after re-admission vs fp64 recurrence: {r['err']:.2e}"
    assert r["tree_slot_err"] < TOL


@KINDS
@pytest.mark.parametrize("scenario", ["clear", "copy", "retract", "abort"])
def test_a_stale_spec_cursor_is_caught(env, scenario, kind):
    """Mutation check (the tests have teeth): with the cursor reset switched off for spec rings
    (``reset_nosync`` a no-op when ``spec_window`` is set: clear_slots / copy_from leave the slot's
    write_pos, origin and flush as the previous owner left them) the numeric core check fails;
    with only origin/flush left stale (write_pos reset) the cursor check fails.  (That second
    mutation is numerically harmless under the current rules: an empty history reads nothing from
    any origin and the flush of an empty history rewrites nothing, and the next commit recomputes
    flush; the fresh-cursor assertion is what pins the reset.)"""
    run = {"clear": scenario_clear, "copy": scenario_copy, "retract": scenario_retract,
           "abort": lambda k: scenario_retract(k, "abort")}[scenario]
    real = ReplayRing.reset_nosync

    def skip_spec(self, slots):
        if self.spec_window is None:
            real(self, slots)

    env.setattr(ReplayRing, "reset_nosync", skip_spec)
    r = run(kind)
    assert r["err"] > 100 * TOL, f"a stale spec cursor went unnoticed (error {r['err']:.2e})"

    def only_write_pos(self, slots):
        idx = torch.as_tensor(slots, dtype=torch.long, device=self.device).reshape(-1)
        self.write_pos.index_fill_(0, idx, 0)

    env.setattr(ReplayRing, "reset_nosync", only_write_pos)
    _SHIMS.undo()
    lifecycle.clear_layer_params()
    r = run(kind)
    fresh = {"clear": lambda: r["after"][3], "copy": lambda: r["dst_after"],
             "retract": lambda: r["b_readmit"]["fresh"], "abort": lambda: r["b_readmit"]["fresh"]}[scenario]()
    assert fresh != (0, 0, 0) and fresh[0] == 0
