"""The slot-lifecycle seam (``patches/lifecycle.py``) on real SGLang 0.5.17 code, on CPU.

Real: ``HybridReqToTokenPool`` / ``MambaPool`` with the ring attached by the pool seam,
and SGLang's own ``mem_cache.common.release_kv_cache`` (patched through the registry,
propagated to the scheduler modules that import it by name).  The tree cache is a
stand-in whose ``cache_finished_req`` records the pool state SGLang would cache and then
stops the release (the rest of ``release_kv_cache`` frees KV, which needs a full token
pool).  Kernels run in Triton's CPU interpreter (tests/conftest.py).
"""

import os
from importlib.metadata import version
from types import SimpleNamespace

import pytest
import torch
from packaging.version import Version

from sglang_replayssm.kernels.materialize import gdn_materialize_ref, mamba2_materialize_ref
from sglang_replayssm.patches import active_patches, launch_check_patches, replay_ring_patches
from sglang_replayssm.patches import lifecycle
from sglang_replayssm.patches import pool as pool_seam
from sglang_replayssm.patches.registry import apply, applicable, is_patched, unapply_all, verify
from sglang_wheels import wheel_for

from sglang_replayssm.patches.source_check import check
from seam_env import replayssm_env

L = 4
MAMBA_SIZE = 6
# 0.5.23: release_kv_cache(req, tree_cache, *, checkpoint) calls tree_cache.checkpoint (insert) or frees the
# row (tree_cache.free_kv_row); the request's KV record and mamba slot live on req.kv
SGLANG_0523 = Version(version("sglang")) >= Version("0.5.23")


@pytest.fixture(autouse=True)
def env(monkeypatch):
    env = replayssm_env(monkeypatch, L)
    lifecycle.clear_layer_params()
    yield env
    unapply_all()
    lifecycle.clear_layer_params()


@pytest.fixture
def patched():
    todo = list(pool_seam.PATCHES) + list(lifecycle.PATCHES)
    apply(todo)
    verify(todo)
    yield


def _params(kind, layers=(0, 2, 5)):
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape

    if kind == "mamba2":  # H=4 P=16 N=16 G=2
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=64, n_groups=2, num_heads=4,
                                        head_dim=16, state_size=16, conv_kernel=4)
    else:  # Hk=1 HV=2 K=16 V=16 (Qwen3-Next layout)
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=32, n_groups=1, num_heads=2,
                                        head_dim=16, state_size=16, conv_kernel=4,
                                        conv_shard_groups=[16, 16, 32])
    return Mamba2CacheParams(shape=shape, layers=list(layers),
                             dtype=Mamba2StateDType(conv=torch.bfloat16, temporal=torch.float32))


def make_pool(kind):
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    params = _params(kind)
    return HybridReqToTokenPool(
        size=4, mamba_size=MAMBA_SIZE, mamba_spec_state_size=4, max_context_len=32, device="cpu",
        enable_memory_saver=False, cache_params=params, mamba_layer_ids=list(params.layers),
        enable_mamba_extra_buffer=False, speculative_num_draft_tokens=None, speculative_eagle_topk=None,
        enable_overlap_schedule=False, start_layer=0)


def fill(pool, gen, write_pos):
    """Random checkpoints and ring contents; the given cursors."""
    ring = pool.mamba_pool.rssm_ring
    temporal = pool.mamba_pool.mamba_cache.temporal
    temporal.copy_(torch.randn(temporal.shape, generator=gen))
    for name, t in ring.tensors.items():
        v = torch.randn(t.shape, generator=gen)
        if name == "dt":
            v = v.abs()
        if name == "g":
            v = -v.abs()
        t.copy_(v.to(t.dtype))
    ring.write_pos.copy_(torch.tensor(write_pos, dtype=torch.int32))
    return ring, temporal


class Cached(Exception):
    pass


class StandInTree:
    """What ``release_kv_cache`` talks to first; records the state it would cache, then stops."""

    def __init__(self, pool, supports_mamba=True, disable=False):
        self.req_to_token_pool = pool
        self._mamba = supports_mamba
        self.disable = disable
        self.seen = None

    def supports_mamba(self):
        return self._mamba

    def cache_finished_req(self, req, is_insert=True, **kw):
        mp = self.req_to_token_pool.mamba_pool
        ring = mp.rssm_ring
        self.seen = (mp.mamba_cache.temporal.clone(), None if ring is None else ring.write_pos.clone(), is_insert)
        raise Cached

    # 0.5.23: a checkpoint keeps the state (insert); free_kv_row frees the row without caching
    def claim_kv_row(self, req):
        return False

    def checkpoint(self, req, up_to=None):
        self.cache_finished_req(req, is_insert=True)

    def free_kv_row(self, kv, spans):
        self.cache_finished_req(None, is_insert=False)


def make_req(slot, **kw):
    if SGLANG_0523:  # the KV record (and the mamba slot) on req.kv
        holds = kw.pop("req_pool_idx", 0) is not None
        kv = SimpleNamespace(holds_kv=holds, is_kv_released=not holds, holds_mamba=True, cache_protected_len=0,
                             mamba_pool_idx=kw.pop("mamba_pool_idx", torch.tensor(slot)))
        kw.pop("kv", None)
        base = dict(kv=kv, skip_radix_cache_insert=False, owned_kv_len=lambda: 5, finished=lambda: True,
                    refresh_fill_ids=lambda: None, rid="r0")
    else:
        base = dict(req_pool_idx=0, kv=SimpleNamespace(), mamba_pool_idx=torch.tensor(slot),
                    skip_radix_cache_insert=False, effective_kv_committed_len=lambda: 5)
    base.update(kw)
    return SimpleNamespace(**base)


def release_kw(**kw):
    """``release_kv_cache`` keywords: ``is_insert`` (default true) before 0.5.23, ``checkpoint`` (required) after."""
    if SGLANG_0523:
        return {"checkpoint": kw.pop("is_insert", True), **kw}
    return kw


def release(req, tree, **kw):
    from sglang.srt.mem_cache import common

    with pytest.raises(Cached):
        common.release_kv_cache(req, tree, **release_kw(**kw))


def expected(kind, ring, temporal, A, slot):
    exp = temporal.clone()
    wp = ring.write_pos.clone()
    for i in range(ring.num_layers):
        lay = ring.layer(i)
        if kind == "mamba2":
            mamba2_materialize_ref(exp[i], lay["x"], lay["B"], lay["dt"], A[i], wp.clone(), [slot])
        else:
            gdn_materialize_ref(exp[i], lay["d"], lay["k"], lay["g"], wp.clone(), [slot])
    return exp


# --------------------------------------------------------------------------------------
# the fold on finish
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_finish_folds_before_the_tree_caches(patched, kind):
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    pool = make_pool(kind)
    ring, temporal = fill(pool, gen, [2, 3, 0, 2, 1, 3, 2])
    A = None
    if kind == "mamba2":
        A = [-torch.rand(4, generator=gen) for _ in range(ring.num_layers)]
        for i, a in enumerate(A):
            lifecycle.register_layer_params(ring, i, A=a)
    before = temporal.clone()
    wp_before = ring.write_pos.clone()
    exp = expected(kind, ring, temporal, A, 3)
    tree = StandInTree(pool)
    release(make_req(3), tree)
    seen_state, seen_wp, is_insert = tree.seen
    assert is_insert is True
    # what SGLang cached: slot 3 folded on every layer, its cursor 0, nothing else touched
    assert (seen_state - exp).abs().max() < 2e-5
    assert float((seen_state[:, 3] - before[:, 3]).abs().max()) > 1e-3
    for s in range(MAMBA_SIZE + 1):
        if s != 3:
            assert torch.equal(seen_state[:, s], before[:, s])
    assert seen_wp[3] == 0
    assert torch.equal(torch.cat([seen_wp[:3], seen_wp[4:]]), torch.cat([wp_before[:3], wp_before[4:]]))
    # the fold is idempotent: a second release finds an empty ring and changes nothing
    release(make_req(3), tree)
    assert torch.equal(tree.seen[0], seen_state)


def test_propagated_to_scheduler_modules():
    """Modules that imported ``release_kv_cache`` by name before apply get the wrapper, and lose it
    on unapply (a module first imported while patched keeps the wrapper: the registry only restores
    the bindings it rewrote)."""
    from sglang.srt.managers import schedule_batch
    from sglang.srt.managers.scheduler_components import batch_result_processor
    from sglang.srt.mem_cache import common

    apply(lifecycle.PATCHES)
    for mod in (common, schedule_batch, batch_result_processor):
        assert is_patched(mod.release_kv_cache, lifecycle.RELEASE_TARGET), mod.__name__
    unapply_all()
    for mod in (common, schedule_batch, batch_result_processor):
        assert not is_patched(mod.release_kv_cache, lifecycle.RELEASE_TARGET), mod.__name__


@pytest.mark.parametrize("case", ["retract", "chunk_cache", "radix_disabled", "skip_insert", "no_ring"])
def test_no_fold_when_the_state_is_discarded(patched, case, monkeypatch):
    gen = torch.Generator().manual_seed(1)
    pool = make_pool("gdn")
    ring, temporal = fill(pool, gen, [0, 2, 3, 1, 2, 3, 1])
    before, wp_before = temporal.clone(), ring.write_pos.clone()
    tree = StandInTree(pool, supports_mamba=case != "chunk_cache", disable=case == "radix_disabled")
    req = make_req(2, skip_radix_cache_insert=case == "skip_insert")
    kw = {"is_insert": False} if case == "retract" else {}
    if case == "no_ring":
        monkeypatch.setattr(pool.mamba_pool, "rssm_ring", None)
    release(req, tree, **kw)
    assert torch.equal(tree.seen[0], before)
    if case != "no_ring":
        assert torch.equal(ring.write_pos, wp_before)


def test_early_free_path_is_left_alone(patched):
    """``req_pool_idx is None`` (mamba slot allocated before KV): SGLang only frees the slot."""
    pool = make_pool("gdn")
    ring, temporal = fill(pool, torch.Generator().manual_seed(2), [0, 2, 3, 1, 2, 3, 1])
    before = temporal.clone()
    slot = pool.mamba_allocator.alloc(1)
    req = make_req(int(slot[0]), req_pool_idx=None, kv=None, mamba_pool_idx=slot[0])
    from sglang.srt.mem_cache import common

    common.release_kv_cache(req, StandInTree(pool), **release_kw())  # returns normally after freeing the slot
    assert (req.kv.mamba_pool_idx if SGLANG_0523 else req.mamba_pool_idx) is None
    assert torch.equal(temporal, before)


def test_mamba2_registration_rules(patched):
    pool = make_pool("mamba2")
    ring, temporal = fill(pool, torch.Generator().manual_seed(3), [0, 2, 3, 1, 2, 3, 1])
    before = temporal.clone()
    # nothing registered: the decode seam never appended -> nothing to fold
    release(make_req(2), StandInTree(pool))
    assert torch.equal(temporal, before) and ring.write_pos[2] == 3
    # ... unless SGLang's pool debug flag is on, which checks the cursor (and here finds entries)
    pool.mamba_pool.debug_memory_pool = True
    from sglang.srt.mem_cache import common

    with pytest.raises(lifecycle.LifecycleError, match="no decode seam registered"):
        common.release_kv_cache(make_req(2), StandInTree(pool), **release_kw())
    pool.mamba_pool.debug_memory_pool = False
    # partial registration is a seam bug
    lifecycle.register_layer_params(ring, 0, A=-torch.ones(4))
    with pytest.raises(lifecycle.LifecycleError, match=r"not registered for pool layer\(s\) \[1, 2\]"):
        common.release_kv_cache(make_req(2), StandInTree(pool), **release_kw())
    with pytest.raises(ValueError, match="needs its A"):
        lifecycle.register_layer_params(ring, 1)
    with pytest.raises(IndexError):
        lifecycle.register_layer_params(ring, 3, A=-torch.ones(4))
    assert sorted(lifecycle.layer_params(ring)) == [0]


def test_overlap_scheduler_is_refused(patched, env):
    from sglang.srt import runtime_context

    pool = make_pool("gdn")
    fill(pool, torch.Generator().manual_seed(4), [0, 2, 3, 1, 2, 3, 1])
    env.setattr(runtime_context.get_context(), "_server_args", SimpleNamespace(disable_overlap_schedule=False))
    from sglang.srt.mem_cache import common

    with pytest.raises(lifecycle.LifecycleError, match="overlap"):
        common.release_kv_cache(make_req(2), StandInTree(pool), **release_kw())
    env.setattr(runtime_context.get_context(), "_server_args", SimpleNamespace(disable_overlap_schedule=True))
    release(make_req(2), StandInTree(pool))


def test_virtual_slot_ids_are_translated(patched, monkeypatch):
    pool = make_pool("gdn")
    ring, temporal = fill(pool, torch.Generator().manual_seed(5), [0, 2, 3, 1, 2, 3, 1])
    monkeypatch.setattr(pool, "translate_mamba_indices", lambda idx: idx + 3, raising=False)
    release(make_req(1), StandInTree(pool))  # virtual 1 -> physical 4
    assert ring.write_pos.tolist() == [0, 2, 3, 1, 0, 3, 1]


# --------------------------------------------------------------------------------------
# registry and other releases
# --------------------------------------------------------------------------------------

def test_seam_switchable_and_one_patch_per_version():
    seams = {p.target for p in replay_ring_patches()}
    checks = {p.target for p in launch_check_patches()}
    assert lifecycle.RELEASE_TARGET in seams and lifecycle.RELEASE_TARGET not in checks
    assert lifecycle.RELEASE_TARGET in {p.target for p in active_patches(True)}
    assert lifecycle.RELEASE_TARGET not in {p.target for p in active_patches(False)}
    for v in ("0.5.15", "0.5.17", "0.5.23"):
        assert len(applicable(lifecycle.PATCHES, v)) == 1, v


def test_apply_verify_unapply():
    assert apply(lifecycle.PATCHES) == [lifecycle.RELEASE_TARGET]
    verify(lifecycle.PATCHES)
    assert apply(lifecycle.PATCHES) == []  # idempotent
    unapply_all()
    from sglang.srt.mem_cache import common

    assert not is_patched(common.release_kv_cache, lifecycle.RELEASE_TARGET)




@pytest.mark.parametrize("version", ["0.5.15", "0.5.23"])
def test_targets_in_other_releases(version):
    assert check(lifecycle.PATCHES, wheel_for(version), version) == []
