"""The pool seam (``patches/pool.py``) on real SGLang 0.5.17 pools, built on CPU.

Real: ``HybridReqToTokenPool`` / ``MambaPool`` (constructed as
``KVCacheConfigurator._build_hybrid_req_pool`` does, with ``Mamba2CacheParams`` from
``Mamba2StateShape.create``), ``clone_with_new_mamba``, ``clear_slots``, ``copy_from``,
``BaseLinearStateParams.mamba_cache_per_req``, and, for the model-config path, real
``ServerArgs``/``ModelConfig`` of the built-in tiny models with their own
``mamba2_cache_params``.  The patches are applied, verified and removed through the
registry.
"""

import os

import pytest
import torch

from sglang_replayssm import models
from sglang_replayssm.patches import active_patches, launch_check_patches, replay_ring_patches
from sglang_replayssm.patches import pool as pool_seam
from sglang_replayssm.patches.registry import applicable, apply, sglang_version, status, unapply_all, verify
from sglang_wheels import wheel_for

from sglang_replayssm.patches.source_check import WheelSource, check
from sglang_replayssm.ring import GDNRingGeometry, Mamba2RingGeometry, ring_bytes_per_slot
from seam_env import replayssm_env

L = 4
MAMBA_SIZE = 6                      # slots 1..6, slot 0 is the dummy -> 7 ring slots


# --------------------------------------------------------------------------------------
# fixtures and builders
# --------------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def env(monkeypatch):
    """ReplaySSM enabled with L=4, nothing else set, and no published ServerArgs."""
    env = replayssm_env(monkeypatch, L)
    yield env  # its setenv / delenv reach the seams (the config is parsed once per process otherwise)
    unapply_all()


@pytest.fixture
def patched():
    assert apply(pool_seam.PATCHES) == [p.target for p in applicable(pool_seam.PATCHES, sglang_version())]
    verify(pool_seam.PATCHES)
    yield


def mamba2_params(H=8, P=16, N=32, G=2, tp=1, layers=(0, 2, 5), ssm=torch.float32):
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape

    shape = Mamba2StateShape.create(tp_world_size=tp, intermediate_size=H * P, n_groups=G, num_heads=H,
                                    head_dim=P, state_size=N, conv_kernel=4)
    return Mamba2CacheParams(shape=shape, layers=list(layers),
                             dtype=Mamba2StateDType(conv=torch.bfloat16, temporal=ssm))


def gdn_params(Hk=2, HV=4, K=32, V=16, layers=(0, 1, 2), ssm=torch.float32):
    """As ``Qwen3NextConfig.mamba2_cache_params`` builds them."""
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape

    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=HV * V, n_groups=Hk, num_heads=HV,
                                    head_dim=V, state_size=K, conv_kernel=4,
                                    conv_shard_groups=[Hk * K, Hk * K, HV * V])
    return Mamba2CacheParams(shape=shape, layers=list(layers),
                             dtype=Mamba2StateDType(conv=torch.bfloat16, temporal=ssm))


def make_pool(params, layer_ids=None):
    """As ``KVCacheConfigurator._build_hybrid_req_pool`` (0.5.17) builds it, on CPU."""
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    return HybridReqToTokenPool(
        size=4, mamba_size=MAMBA_SIZE, mamba_spec_state_size=4, max_context_len=32, device="cpu",
        enable_memory_saver=False, cache_params=params,
        mamba_layer_ids=list(params.layers if layer_ids is None else layer_ids),
        enable_mamba_extra_buffer=False, speculative_num_draft_tokens=None, speculative_eagle_topk=None,
        enable_overlap_schedule=True, start_layer=0)


def ring_of(pool):
    return getattr(pool.mamba_pool, "rssm_ring", None)


def original_per_req(params):
    from sglang.srt.configs.mamba_utils import BaseLinearStateParams

    fget = BaseLinearStateParams.__dict__["mamba_cache_per_req"].fget
    return getattr(fget, "__wrapped__", fget)(params)


def slot_bytes_from_tensors(ring):
    """Bytes of one (layer, slot) of the allocated ring, read off its tensors."""
    return sum(t[0, 0].numel() * t.element_size() for t in ring.tensors.values())


# --------------------------------------------------------------------------------------
# allocation
# --------------------------------------------------------------------------------------

def test_mamba2_ring_matches_the_pool(patched):
    H, P, N, G = 8, 16, 32, 2
    params = mamba2_params(H, P, N, G)
    pool = make_pool(params)
    ring = ring_of(pool)
    temporal = pool.mamba_pool.mamba_cache.temporal
    S = MAMBA_SIZE + 1
    assert ring is not None and ring.kind == "mamba2"
    assert ring.geom == Mamba2RingGeometry(nheads=H, head_dim=P, dstate=N, ngroups=G, buffer_len=L,
                                           act_dtype=torch.bfloat16)
    assert ring.num_slots == S == temporal.shape[1] == pool.mamba_pool.size + 1
    assert ring.num_layers == len(params.layers) == temporal.shape[0]
    want = {"x": ((H, L, P), torch.bfloat16), "B": ((G, L, N), torch.bfloat16), "dt": ((H, L), torch.float32)}
    for name, (shape, dtype) in want.items():
        t = ring.tensors[name]
        assert tuple(t.shape) == (len(params.layers), S) + shape and t.dtype == dtype
        assert t.device == temporal.device
    assert ring.write_pos.shape == (S,) and ring.write_pos.dtype == torch.int32
    assert int(ring.write_pos.abs().sum()) == 0
    # the decode seams index by SGLang's pool layer index (mamba_map)
    views = ring.layer(pool.mamba_map[5])
    assert views["x"].data_ptr() == ring.tensors["x"][2].data_ptr() and views["x"].shape == (S, H, L, P)


def test_the_log_states_what_the_ring_costs_in_slots(patched, caplog):
    """Honest slot accounting: the allocation line gives the ring's bytes a slot beside the slot's SSM state and the
    share of slots (and so of running requests) the same memory loses to it."""
    H, P, N, G = 8, 16, 32, 2
    with caplog.at_level("INFO", logger="sglang_replayssm"):
        pool = make_pool(mamba2_params(H, P, N, G))
    ring, temporal = ring_of(pool), pool.mamba_pool.mamba_cache.temporal
    from sglang_replayssm.patches.pool import ring_slot_share

    ring_b, state_b = ring_slot_share(ring, temporal)
    assert state_b == temporal.shape[0] * H * P * N * temporal.element_size()
    assert ring_b >= temporal.shape[0] * slot_bytes_from_tensors(ring)  # + the cursors
    share = 100.0 * ring_b / (ring_b + state_b)
    assert f"the same memory holds {share:.1f}% fewer slots (and running requests)" in caplog.text
    assert f"{ring_b / (1 << 20):.2f} MiB a slot beside its {state_b / (1 << 20):.2f} MiB SSM state" in caplog.text


@pytest.mark.parametrize("ssm", [torch.float32, torch.bfloat16])
def test_gdn_ring_matches_the_pool(patched, ssm, caplog):
    Hk, HV, K, V = 2, 4, 32, 16
    with caplog.at_level("WARNING", logger="sglang_replayssm"):
        pool = make_pool(gdn_params(Hk, HV, K, V, ssm=ssm))
    # a 16-bit GDN state is served, with a warning that the replay kernel gains little there
    assert ("bfloat16 SSM state: the replay decode kernel gains little" in caplog.text) == (ssm == torch.bfloat16)
    ring = ring_of(pool)
    temporal = pool.mamba_pool.mamba_cache.temporal
    assert temporal.dtype == ssm and tuple(temporal.shape[2:]) == (HV, V, K)
    assert ring.kind == "gdn"
    assert ring.geom == GDNRingGeometry(num_k_heads=Hk, num_v_heads=HV, head_k_dim=K, head_v_dim=V, buffer_len=L,
                                        act_dtype=torch.bfloat16, state_dtype=ssm)
    S = temporal.shape[1]
    assert tuple(ring.tensors["d"].shape) == (3, S, HV, L, V) and ring.tensors["d"].dtype == ssm
    assert tuple(ring.tensors["k"].shape) == (3, S, Hk, L, K) and ring.tensors["k"].dtype == torch.bfloat16
    assert tuple(ring.tensors["g"].shape) == (3, S, HV, L) and ring.tensors["g"].dtype == torch.float32


@pytest.mark.parametrize("n_groups,tp,H", [(2, 1, 8), (8, 2, 16), (2, 4, 16), (1, 2, 8), (3, 2, 12)])
def test_groups_per_rank_follow_sglangs_widening(n_groups, tp, H):
    """G derived from the per-rank conv shape equals SGLang's widened n_groups // tp."""
    from sglang.srt.configs.mamba_utils import extra_groups_for_head_shards

    params = mamba2_params(H=H, P=16, N=32, G=n_groups, tp=tp)
    plan = pool_seam.plan_ring(params, pool_seam.current(), model_config=None)
    widened = n_groups + extra_groups_for_head_shards(n_groups, tp)
    assert plan.geom.ngroups == widened // tp and plan.geom.nheads == H // tp


def test_inconsistent_conv_shape_is_refused():
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape

    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=8 * 16 + 5, n_groups=2, num_heads=8,
                                    head_dim=16, state_size=32, conv_kernel=4)
    with pytest.raises(pool_seam.RingGeometryError, match="n_groups"):
        pool_seam.plan_ring(Mamba2CacheParams(shape=shape, layers=[0]), pool_seam.current(), model_config=None)


def test_pools_without_ssm_state_get_no_ring(patched):
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape

    # LFM2-style conv-only layers (state_size 0)
    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=64, n_groups=1, num_heads=1,
                                    head_dim=64, state_size=0, conv_kernel=3)
    params = Mamba2CacheParams(shape=shape, layers=[0, 1])
    assert ring_of(make_pool(params)) is None
    assert params.mamba_cache_per_req == original_per_req(params)


# --------------------------------------------------------------------------------------
# SSM type and dtype from the model's config (real ServerArgs / ModelConfig)
# --------------------------------------------------------------------------------------

def publish_tiny(env, tmp_path, name, *extra):
    from sglang.srt import runtime_context
    from sglang.srt.server_args import prepare_server_args

    path = models.materialize(name, root=tmp_path)
    args = prepare_server_args(["--model-path", path, "--load-format", "dummy", "--skip-tokenizer-init",
                                "--device", "cpu", "--disable-radix-cache", *extra])
    env.setattr(runtime_context.get_context(), "_server_args", args)
    if hasattr(runtime_context, "process_model_config"):  # 0.5.23: built on first use, memoized on the record
        mc = runtime_context.process_model_config()
        assert vars(args)["_model_config"] is mc
    else:
        assert "model_config" in vars(args)  # cached by ServerArgs.get_model_config in __post_init__
        mc = args.model_config
    assert pool_seam.published_config() == (args, mc)
    par = runtime_context.get_parallel()
    sharing = {"enable_cp_tp_group_sharing": False} if hasattr(runtime_context, "linear_attn_tp_size") else {}
    with par.override(attn_tp_size=1, **sharing):
        return mc, mc.hf_config.mamba2_cache_params


def test_model_config_gives_type_and_activation_dtype(env, tmp_path, patched):
    # NemotronH served in fp16: a Mamba2 ring with fp16 x/B
    mc, params = publish_tiny(env, tmp_path, "tiny-nemotron-h", "--dtype", "float16")
    assert mc.dtype == torch.float16
    ring = ring_of(make_pool(params))
    cfg = mc.hf_config
    assert ring.kind == "mamba2" and ring.geom.act_dtype == torch.float16
    assert (ring.geom.nheads, ring.geom.head_dim, ring.geom.dstate, ring.geom.ngroups) == (
        cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.ssm_state_size, cfg.n_groups)
    assert ring.tensors["x"].dtype == torch.float16 and ring.num_layers == len(cfg.mamba_layer_ids)
    # the model config wins over the shape fallback: GDN-looking params under a NemotronH config
    assert pool_seam.plan_ring(gdn_params(), pool_seam.current()).kind == "mamba2"

    # Qwen3-Next ("auto" dtype -> the checkpoint's bf16): a GDN ring
    mc, params = publish_tiny(env, tmp_path, "tiny-qwen3-next")
    ring = ring_of(make_pool(params))
    cfg = mc.hf_config
    assert ring.kind == "gdn" and ring.geom.act_dtype == mc.dtype == torch.bfloat16
    assert (ring.geom.num_k_heads, ring.geom.num_v_heads, ring.geom.head_k_dim, ring.geom.head_v_dim) == (
        cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
    assert pool_seam.plan_ring(mamba2_params(), pool_seam.current()).kind == "gdn"


def test_explicit_server_dtype_without_model_config():
    from types import SimpleNamespace

    assert pool_seam.activation_dtype(None, SimpleNamespace(dtype="half")) == (torch.float16, "ServerArgs.dtype")
    assert pool_seam.activation_dtype(None, SimpleNamespace(dtype="auto"))[0] == torch.bfloat16
    assert pool_seam.activation_dtype(None, None)[0] == torch.bfloat16


# --------------------------------------------------------------------------------------
# slot lifecycle
# --------------------------------------------------------------------------------------

def forbid_host_sync(mp):
    """Make every tensor -> Python conversion raise (what a host sync would need)."""
    def boom(*a, **k):
        raise AssertionError("host sync in a forward-stream hook")

    for name in ("item", "tolist", "__int__", "__index__", "__bool__", "__float__"):
        mp.setattr(torch.Tensor, name, boom)


def test_clear_slots_resets_exactly_those_slots_without_sync(patched):
    pool = make_pool(mamba2_params())
    ring = ring_of(pool)
    before = torch.arange(ring.num_slots, dtype=torch.int32) % (L - 1) + 1
    ring.write_pos.copy_(before)
    pool.mamba_pool.mamba_cache.temporal.fill_(1.0)
    idx = torch.tensor([2, 5], dtype=torch.int64)
    with pytest.MonkeyPatch.context() as mp:
        forbid_host_sync(mp)
        with pytest.raises(AssertionError, match="host sync"):
            ring.reset(idx)  # the bounds-checked reset syncs: the guard has teeth
        ring.reset_nosync(idx.to(torch.int32))
        ring.write_pos.copy_(before)
        pool.mamba_pool.clear_slots(idx)
    want = before.clone()
    want[idx] = 0
    assert torch.equal(ring.write_pos, want)
    temporal = pool.mamba_pool.mamba_cache.temporal  # SGLang's own clear still ran
    assert float(temporal[:, idx].abs().sum()) == 0 and float(temporal[:, 1].sum()) > 0
    pool.mamba_pool.clear_slots(indices=torch.tensor([1]))  # keyword call
    assert int(ring.write_pos[1]) == 0


def test_copy_from_copies_state_and_resets_only_dst(patched):
    pool = make_pool(mamba2_params())
    mp_, ring = pool.mamba_pool, ring_of(pool)
    temporal = mp_.mamba_cache.temporal
    temporal.copy_(torch.randn_like(temporal))
    for t in ring.tensors.values():
        t.copy_(torch.randn(t.shape).to(t.dtype))
    ring.write_pos.copy_(torch.tensor([0, 0, 3, 2, 1, 3, 2], dtype=torch.int32))  # src 1 is flushed
    ring_before = {k: v.clone() for k, v in ring.tensors.items()}
    wp_before = ring.write_pos.clone()
    src, dst = torch.tensor([1]), torch.tensor([4])
    with pytest.MonkeyPatch.context() as m:
        forbid_host_sync(m)
        mp_.copy_from(src, dst)
    assert torch.equal(temporal[:, 4], temporal[:, 1])  # SGLang's copy ran
    want = wp_before.clone()
    want[4] = 0
    assert torch.equal(ring.write_pos, want)
    for k, v in ring.tensors.items():  # ring entries are not copied (dst is checkpoint-only)
        assert torch.equal(v, ring_before[k]), k


def test_copy_from_debug_mode_refuses_an_unflushed_source(patched):
    pool = make_pool(gdn_params())
    mp_, ring = pool.mamba_pool, ring_of(pool)
    mp_.debug_memory_pool = True  # SGLANG_DEBUG_MEMORY_POOL
    ring.write_pos[2] = 3
    with pytest.raises(pool_seam.UnflushedCopyError, match="must be flushed"):
        mp_.copy_from(torch.tensor([2]), torch.tensor([5]))
    ring.write_pos[2] = 0
    ring.write_pos[5] = 1
    mp_.copy_from(src_indices=torch.tensor([2]), dst_indices=torch.tensor([5]))
    assert int(ring.write_pos[5]) == 0


def test_draft_clone_gets_no_ring(patched):
    params = mamba2_params()
    pool = make_pool(params)
    ring = ring_of(pool)
    clone = pool.clone_with_new_mamba(mamba_size=MAMBA_SIZE, mamba_spec_state_size=4, cache_params=params,
                                      device="cpu", enable_mamba_extra_buffer=False, draft_model_idx=9)
    assert clone.mamba_pool is not pool.mamba_pool and ring_of(clone) is None
    assert ring_of(pool) is ring  # the target keeps its ring
    clone.mamba_pool.clear_slots(torch.tensor([1]))  # hooks are no-ops without a ring
    clone.mamba_pool.copy_from(torch.tensor([1]), torch.tensor([2]))
    assert ring_of(make_pool(params)) is not None  # an independent pool is not a clone


@pytest.mark.parametrize("types,mamba2_ring,gdn_ring", [("gdn", False, True), ("mamba2", True, False)])
def test_ssm_types_filter(env, patched, types, mamba2_ring, gdn_ring):
    env.setenv("SGLANG_REPLAYSSM_SSM_TYPES", types)
    for params, has in ((mamba2_params(), mamba2_ring), (gdn_params(), gdn_ring)):
        assert (ring_of(make_pool(params)) is not None) == has
        assert (params.mamba_cache_per_req > original_per_req(params)) == has


def test_disabled_is_inert(env, patched):
    env.setenv("SGLANG_REPLAYSSM_ENABLE", "0")
    params = mamba2_params()
    pool = make_pool(params)
    assert ring_of(pool) is None
    assert params.mamba_cache_per_req == original_per_req(params)
    pool.mamba_pool.clear_slots(torch.tensor([1]))


def test_the_seams_read_the_activated_config(env, patched):
    """The seams follow the config in force (config.activate: the plugin's), not a fresh read of the
    environment: activated off while the environment says on, no ring and no charge."""
    from sglang_replayssm import config

    config.activate(config.current().replace(enable=False))
    params = mamba2_params()
    assert ring_of(make_pool(params)) is None
    assert params.mamba_cache_per_req == original_per_req(params)
    config.activate(config.current().replace(enable=True, buffer_len=8))
    ring = ring_of(make_pool(mamba2_params()))
    assert ring is not None and ring.buffer_len == 8 != L


# --------------------------------------------------------------------------------------
# memory charge
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [mamba2_params, gdn_params, lambda: gdn_params(ssm=torch.bfloat16)])
def test_mamba_cache_per_req_grows_by_the_allocated_ring(make):
    params = make()
    base = params.mamba_cache_per_req
    apply(pool_seam.PATCHES)
    ring = ring_of(make_pool(params))
    assert slot_bytes_from_tensors(ring) == ring_bytes_per_slot(ring.geom)
    assert params.mamba_cache_per_req - base == slot_bytes_from_tensors(ring) * len(params.layers)
    # a PP stage holding a subset of the layers still charges per model layer (SGLang scales by PP)
    stage = ring_of(make_pool(params, layer_ids=params.layers[:1]))
    assert stage.num_layers == 1 and params.mamba_cache_per_req - base == slot_bytes_from_tensors(stage) * len(
        params.layers)


# --------------------------------------------------------------------------------------
# registry: idempotence, removal, staging, other releases
# --------------------------------------------------------------------------------------

def test_idempotent_apply_and_full_unapply():
    from sglang.srt.configs.mamba_utils import BaseLinearStateParams
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool, MambaPool

    originals = {
        "init": HybridReqToTokenPool.__dict__["_init_mamba_pool"],
        "clear": MambaPool.__dict__["clear_slots"],
        "copy": MambaPool.__dict__["copy_from"],
        "prop": BaseLinearStateParams.__dict__["mamba_cache_per_req"],
    }
    params = mamba2_params()
    base = params.mamba_cache_per_req
    apply(pool_seam.PATCHES)
    prop = BaseLinearStateParams.__dict__["mamba_cache_per_req"]
    assert isinstance(prop, property) and prop.fget.__wrapped__ is originals["prop"].fget
    assert apply(pool_seam.PATCHES) == []
    assert BaseLinearStateParams.__dict__["mamba_cache_per_req"] is prop
    live = {p.target for p in applicable(pool_seam.PATCHES, sglang_version())}
    assert [s for t, s, _ in status(pool_seam.PATCHES) if t in live] == ["patched"] * len(live)
    assert all(s == "skipped" for t, s, _ in status(pool_seam.PATCHES) if t not in live)
    pool = make_pool(params)
    assert ring_of(pool) is not None and params.mamba_cache_per_req > base
    unapply_all()
    assert HybridReqToTokenPool.__dict__["_init_mamba_pool"] is originals["init"]
    assert MambaPool.__dict__["clear_slots"] is originals["clear"]
    assert MambaPool.__dict__["copy_from"] is originals["copy"]
    assert BaseLinearStateParams.__dict__["mamba_cache_per_req"] is originals["prop"]
    assert params.mamba_cache_per_req == base
    assert not hasattr(make_pool(params).mamba_pool, "rssm_ring")
    assert [s for t, s, _ in status(pool_seam.PATCHES) if t in live] == ["resolved"] * len(live)


def test_pool_patches_are_seams_off_with_replay_ring_false():
    seams = {p.target for p in replay_ring_patches()}
    checks = {p.target for p in launch_check_patches()}
    on, off = ({p.target for p in active_patches(s)} for s in (True, False))
    for p in pool_seam.PATCHES:
        assert p.target in seams and p.target not in checks
        assert p.target in on and p.target not in off




@pytest.mark.parametrize("version", ["0.5.15", "0.5.23"])
def test_targets_in_other_releases(version):
    import ast

    wheel = wheel_for(version)
    assert check(pool_seam.PATCHES, wheel, version) == []
    # the charge target must still be a property there (the swap replaces a property)
    src = WheelSource(wheel)
    tree = src.tree(src.module_file("sglang.srt.configs.mamba_utils"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "BaseLinearStateParams")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "mamba_cache_per_req")
    assert any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)


@pytest.mark.parametrize("version", ["0.5.15", "0.5.23"])
def test_type_and_config_sources_exist_in_other_releases(version):
    """What plan_ring reads besides the patch targets: the published ServerArgs and
    SGLang's Mamba2/GDN predicates (configs.hybrid_arch, or ModelRunner properties in 0.5.15)."""
    import ast

    src = WheelSource(wheel_for(version))

    def defs(module, cls=None):
        body = src.tree(src.module_file(module)).body
        if cls is not None:
            body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
        return {n.name for n in body if isinstance(n, ast.FunctionDef)}

    assert "get_server_args" in defs("sglang.srt.runtime_context")
    if src.module_file("sglang.srt.configs.hybrid_arch"):
        assert {"hybrid_gdn_config", "mamba2_config"} <= defs("sglang.srt.configs.hybrid_arch")
    else:
        assert version == "0.5.15"
        assert {"hybrid_gdn_config", "mamba2_config"} <= defs("sglang.srt.model_executor.model_runner",
                                                              "ModelRunner")
    assert "_init_mamba_pool" in defs("sglang.srt.mem_cache.memory_pool", "HybridReqToTokenPool")


# ======================================================================================
# speculative decoding: spec ring, no per-draft SSM snapshots, solver without them
# ======================================================================================


@pytest.fixture
def cuda_allocs_on_cpu(monkeypatch):
    """CPU shim: MambaPool allocates its verify scratch (conv windows) with a hard-coded
    device="cuda"; without CUDA those allocations go to the CPU (same shapes and layout)."""
    if torch.cuda.is_available():
        return
    orig = pool_seam._SnapshotFreeTorch.zeros

    def zeros(self, *a, **k):
        if k.get("device") == "cuda":
            k = {**k, "device": "cpu"}
        return orig(self, *a, **k)

    monkeypatch.setattr(pool_seam._SnapshotFreeTorch, "zeros", zeros)


def make_spec_pool(params, draft_tokens):
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    return HybridReqToTokenPool(
        size=4, mamba_size=MAMBA_SIZE, mamba_spec_state_size=4, max_context_len=32, device="cpu",
        enable_memory_saver=False, cache_params=params, mamba_layer_ids=list(params.layers),
        enable_mamba_extra_buffer=False, speculative_num_draft_tokens=draft_tokens, speculative_eagle_topk=1,
        enable_overlap_schedule=True, start_layer=0)


def test_spec_pool_gets_a_spec_ring_and_no_snapshot_buffer(env, patched, cuda_allocs_on_cpu):
    """The pool SGLang builds for a speculating server (draft tokens D): a spec ring of length L + D,
    the per-draft SSM snapshot buffer with zero slots (never allocated), the conv windows intact."""
    params = mamba2_params()
    D = 3
    pool = make_spec_pool(params, D)
    ring = ring_of(pool)
    cache = pool.mamba_pool.mamba_cache
    assert ring is not None and ring.spec_window == D and ring.ring_len == L + D
    assert ring.origin is not None and ring.flush is not None
    assert cache.intermediate_ssm.shape[1] == 0 and cache.intermediate_ssm.numel() == 0
    assert tuple(cache.intermediate_ssm.shape[2:]) == (D,) + tuple(params.shape.temporal)
    win = cache.intermediate_conv_window[0]
    assert win.shape[0] == len(params.layers) and win.shape[1] == 5 and win.shape[2] == D
    spec = pool.get_speculative_mamba2_params_all_layers()
    assert spec.intermediate_ssm is cache.intermediate_ssm


def test_spec_disabled_keeps_sglangs_snapshots(env, patched, monkeypatch):
    """--replayssm-spec false: no spec ring, and SGLang allocates its snapshots as usual (on CUDA,
    hard-coded in 0.5.17: on a CPU-only host that allocation is what fails)."""
    env.setenv("SGLANG_REPLAYSSM_SPEC", "false")
    from importlib.metadata import version

    from packaging.version import Version

    params = mamba2_params()
    # 0.5.23 allocates the snapshots on the pool's device: they build on a CPU-only host too
    if torch.cuda.is_available() or Version(version("sglang")) >= Version("0.5.23"):
        pool = make_spec_pool(params, 2)
        assert pool.mamba_pool.mamba_cache.intermediate_ssm.shape[1] == 5
        assert ring_of(pool).spec_window is None
    else:
        with pytest.raises((RuntimeError, AssertionError), match="(?i)nvidia|cuda"):
            make_spec_pool(params, 2)


def test_snapshot_interception_is_verified(env, patched, monkeypatch):
    """If MambaPool stops allocating its snapshots through the expected call, the hook raises."""
    from sglang_replayssm.patches.registry import PatchError

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    monkeypatch.setattr(pool_seam._SnapshotFreeTorch, "zeros",
                        lambda self, *a, **k: self._real.zeros(*a, **{**k, "device": dev}))
    with pytest.raises(PatchError, match="did not allocate its per-draft SSM snapshots"):
        make_spec_pool(mamba2_params(), 2)


@pytest.mark.parametrize("make", [mamba2_params, gdn_params])
def test_spec_ring_clear_and_copy_reset_all_three_cursors_without_sync(env, patched, cuda_allocs_on_cpu, make):
    """On a spec ring, clear_slots and copy_from reset write_pos, origin AND flush of exactly the
    cleared / destination slots (no host sync); a copy leaves its source's cursors and ring alone.
    (The numeric consequences: tests/patches/test_spec_slot_reuse.py.)"""
    pool = make_spec_pool(make(), 3)
    mp_, ring = pool.mamba_pool, ring_of(pool)
    assert ring.spec_window == 3 and ring.verify_cursors is not None
    S = ring.num_slots
    wp0 = torch.arange(S, dtype=torch.int32) % 4 + 1          # every slot mid-cycle
    org0 = (torch.arange(S, dtype=torch.int32) * 3) % (ring.ring_len - 1) + 1  # in [1, R-1]
    fl0 = (wp0 + 2 * 3 > ring.ring_len).to(torch.int32)
    assert int(fl0.sum()) > 0 and int(org0.min()) > 0

    def set_cursors():
        for c, v in zip(ring.verify_cursors, (wp0, org0, fl0)):
            c.copy_(v)

    def want(slots):
        out = [wp0.clone(), org0.clone(), fl0.clone()]
        for c in out:
            c[slots] = 0
        return out

    set_cursors()
    with pytest.MonkeyPatch.context() as m:
        forbid_host_sync(m)
        mp_.clear_slots(torch.tensor([2, 5]))
    for got, exp in zip(ring.verify_cursors, want([2, 5])):
        assert torch.equal(got, exp)

    set_cursors()
    ring.write_pos[1] = 0  # a flushed source (what the tree hands to a COW)
    ring.flush[1] = 0
    for t in ring.tensors.values():
        t.copy_(torch.randn(t.shape).to(t.dtype))
    ring_before = {k: v.clone() for k, v in ring.tensors.items()}
    src_before = [int(c[1]) for c in ring.verify_cursors]
    with pytest.MonkeyPatch.context() as m:
        forbid_host_sync(m)
        mp_.copy_from(torch.tensor([1]), torch.tensor([4]))
    assert [int(c[1]) for c in ring.verify_cursors] == src_before
    assert [int(c[4]) for c in ring.verify_cursors] == [0, 0, 0]
    others = [s for s in range(S) if s not in (1, 4)]
    for got, exp in zip(ring.verify_cursors, (wp0, org0, fl0)):
        assert torch.equal(got[others], exp[others])
    for k, v in ring.tensors.items():
        assert torch.equal(v, ring_before[k]), k


class _Algo:
    def __init__(self, none):
        self._none = none

    def is_none(self):
        return self._none


_Algo.NONE = _Algo(True)


def test_solver_sees_no_speculation_only_with_a_spec_ring(env):
    """The solver hook hides speculation (spec_algorithm NONE) during the call, restores it after,
    and leaves the solver alone without ReplaySSM spec, without a ring, or without speculation."""
    from types import SimpleNamespace

    seen = []

    def solver(self, rest):
        seen.append(self.spec_algorithm.is_none())
        return rest - 1.0

    eagle = _Algo(False)
    params = mamba2_params()
    sa = SimpleNamespace(speculative_num_draft_tokens=4, max_running_requests=7)
    runner = SimpleNamespace(spec_algorithm=eagle, mambaish_config=SimpleNamespace(mamba2_cache_params=params),
                             server_args=sa)
    conv_gb = pool_seam.conv_window_bytes(params, sa) / (1 << 30)
    conv_state = params.shape.conv[0][0] * params.shape.conv[0][1] * params.dtype.conv.itemsize
    assert conv_gb * (1 << 30) == conv_state * len(params.layers) * 4 * 8
    assert pool_seam.handle_max_mamba_cache_around(solver, runner, 10.0) == pytest.approx(9.0 - conv_gb)
    assert seen == [True] and runner.spec_algorithm is eagle
    env.setenv("SGLANG_REPLAYSSM_SPEC", "false")
    pool_seam.handle_max_mamba_cache_around(solver, runner, 10.0)
    env.setenv("SGLANG_REPLAYSSM_SPEC", "true")
    env.setenv("SGLANG_REPLAYSSM_SSM_TYPES", "gdn")  # a Mamba2 model then gets no ring
    pool_seam.handle_max_mamba_cache_around(solver, runner, 10.0)
    env.delenv("SGLANG_REPLAYSSM_SSM_TYPES")
    runner.spec_algorithm = _Algo.NONE
    pool_seam.handle_max_mamba_cache_around(solver, runner, 10.0)
    assert seen == [True, False, False, True]


def test_solver_hook_on_sglangs_slots_configurator(env):
    """The real KVCacheConfigurator is a slots dataclass (no __dict__): the hook swaps its
    spec_algorithm and restores it."""
    from types import SimpleNamespace

    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    kc = object.__new__(KVCacheConfigurator)
    assert not hasattr(kc, "__dict__")
    kc.spec_algorithm = SpeculativeAlgorithm.EAGLE
    kc.server_args = SimpleNamespace(speculative_num_draft_tokens=4, max_running_requests=8)
    kc.model_config = None
    seen = []
    cfg_params = mamba2_params()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(KVCacheConfigurator, "mambaish_config", property(
            lambda self: SimpleNamespace(mamba2_cache_params=cfg_params)), raising=False)
        out = pool_seam.handle_max_mamba_cache_around(
            lambda self, rest: (seen.append(self.spec_algorithm.is_none()), rest)[1], kc, 5.0)
    assert seen == [True] and kc.spec_algorithm is SpeculativeAlgorithm.EAGLE and out < 5.0


@pytest.mark.parametrize("version", ["0.5.15", "0.5.17", "0.5.23"])
def test_solver_reads_speculation_only_through_spec_algorithm(version):
    """The solver hook's premise, per release: the solver function mentions speculation only as
    ``self.spec_algorithm.is_none()`` (its other spec inputs sit in branches that test it)."""
    import ast
    import inspect

    from sglang_replayssm.patches.registry import version_matches

    patch = next(p for p in pool_seam.PATCHES if "max_mamba_cache" in p.target
                 and version_matches(version, p.versions))
    mod, cls, fn = patch.target.rsplit(".", 2)
    if version == "0.5.17":
        import importlib

        text = inspect.getsource(getattr(getattr(importlib.import_module(mod), cls), fn))
    else:
        from sglang_wheels import wheel_for

        from sglang_replayssm.patches.source_check import WheelSource, locate

        src = WheelSource(wheel_for(version))
        _, where = locate(src, patch.target)
        fname, line = where.split(":")
        node = next(n for n in ast.walk(src.tree(fname)) if isinstance(n, ast.FunctionDef)
                    and n.name == fn and n.lineno == int(line))
        text = ast.get_source_segment(src.zip.read(fname).decode(), node)
    assert text.count("spec_algorithm") == 1 and "self.spec_algorithm.is_none()" in text


# --------------------------------------------------------------------------------------
# SGLang's real pool solver under the ring verifier: capacity from memory, draft KV charged
# --------------------------------------------------------------------------------------

@pytest.fixture
def spec_solver(env, tmp_path, patched):
    """SGLang 0.5.17's own ``KVCacheConfigurator._handle_max_mamba_cache`` (patched) on a
    configurator of the tiny NemotronH with an MTP layer, its config published as a scheduler
    publishes it, and the speculative settings SGLang resolves for NEXTN (4 draft tokens, the
    flat default of 48 max running requests)."""
    from types import SimpleNamespace

    from sglang.srt import runtime_context
    from sglang.srt.configs.hybrid_arch import mambaish_config
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
        SpecAuxHiddenStateConfig)
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    ctx = runtime_context.get_context()
    env.setattr(ctx, "_config_bags", ctx._config_bags)  # restored after the test
    path = models.materialize("tiny-nemotron-h", root=tmp_path, num_nextn_predict_layers=1)
    args = prepare_server_args(["--model-path", path, "--load-format", "dummy", "--skip-tokenizer-init",
                                "--device", "cpu", "--disable-radix-cache"])
    runtime_context.publish(args, role="test")
    ctx.override("test: NEXTN as SGLang resolves it", speculative_num_draft_tokens=4, max_running_requests=48)
    mc = runtime_context.process_model_config() if hasattr(runtime_context, "process_model_config") \
        else args.model_config  # 0.5.23 keeps ModelConfig as a memo built on first use
    kc = object.__new__(KVCacheConfigurator)
    fields = dict(model_config=mc, server_args=args, spec_algorithm=SpeculativeAlgorithm.EAGLE,
                  spec_aux_config=SpecAuxHiddenStateConfig(), mambaish_config=mambaish_config(mc),
                  hybrid_gdn_config=None)
    if hasattr(KVCacheConfigurator, "fused_entry_bytes"):  # 0.5.23: a slotted dataclass, PP and KDA fields
        fields.update(pp_size=1, attn_dp_size=1, hybrid_kda_config=None, extra_mamba_cache_bytes_per_req=0)
        env.setattr(KVCacheConfigurator, "fused_entry_bytes", lambda self, name: None)  # no fused draft
    else:
        fields.update(ps=SimpleNamespace(pp_size=1, attn_dp_size=1))
    for name, value in fields.items():
        setattr(kc, name, value)
    with runtime_context.get_parallel().override(attn_tp_size=1):
        params = kc.mambaish_config.mamba2_cache_params
        per_slot = params.mamba_cache_per_req  # patched: includes the spec ring
        assert per_slot > original_per_req(params)
        yield SimpleNamespace(kc=kc, params=params, per_slot=per_slot, sched=runtime_context.get_schedule,
                              n_attn=len(kc.mambaish_config.full_attention_layer_ids))


def _expected(rest_gb, slots, s):
    windows = pool_seam.conv_window_bytes(s.params, pool_seam._resolved_sizes(s.kc)) / (1 << 30)
    return (rest_gb - (slots + 1) * s.per_slot / (1 << 30) - windows) * s.n_attn / (s.n_attn + 1)


def test_solver_keeps_sglangs_max_running_by_default(spec_solver, env):
    """spec_max_running=sglang: 48 requests and 48 slots (SGLang's branch for an explicit count), no
    snapshot reserve, and the KV budget shared with the MTP draft's one attention layer."""
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator

    s = spec_solver
    rest = 1000 * s.per_slot / (1 << 30)
    out = KVCacheConfigurator._handle_max_mamba_cache(s.kc, rest)
    assert (s.sched().max_running_requests, s.sched().max_mamba_cache_size) == (48, 48)
    assert out == pytest.approx(_expected(rest, 48, s))
    assert s.kc.spec_algorithm.is_eagle()  # restored


@pytest.mark.parametrize("budget_slots,expect", [(40, "memory"), (5000, "cap")])
def test_solver_sizes_max_running_from_memory_in_auto_mode(spec_solver, env, budget_slots, expect):
    """spec_max_running=auto: SGLang's non-speculative branch fits K slots into the mamba share of
    the budget; max running = min(K, max(decode graph batch, 48)).  Above the cap the pool shrinks
    to the cap and the unused slots' bytes go to the KV budget."""
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator

    env.setenv("SGLANG_REPLAYSSM_SPEC_MAX_RUNNING", "auto")
    env.delenv(pool_seam.FLASHINFER_WORKSPACE_ENV, raising=False)
    s = spec_solver
    ratio = s.sched().mamba_full_memory_ratio
    rest = budget_slots * s.per_slot * (1 + ratio) / ratio / (1 << 30)
    fit = int((rest * ratio / (1 + ratio) * (1 << 30) - s.per_slot) // s.per_slot)
    out = KVCacheConfigurator._handle_max_mamba_cache(s.kc, rest)
    cap = max(pool_seam._graph_decode_max_bs(pool_seam._config_bags(s.kc)), 48)
    n = s.sched().max_running_requests
    assert s.sched().max_mamba_cache_size == n
    if expect == "memory":
        assert n == fit < cap and n != 48
    else:
        assert fit > cap and n == cap
    # unused slots are not allocated: the KV budget is what is left after n + 1 slots
    assert out == pytest.approx(_expected(rest, n, s))
    # what SGLang then serves: its own resolve_max_num_reqs gives n running requests
    assert KVCacheConfigurator.resolve_max_num_reqs(s.kc, 10 ** 7) == n
    # FlashInfer's workspace grows with verify batches (n requests x 4 tokens) beyond SGLang's 48
    want = pool_seam.WORKSPACE_BASE_BYTES + n * 4 * pool_seam.WORKSPACE_BYTES_PER_VERIFY_TOKEN
    widened = n > 48 and want > 384 << 20
    assert os.environ.get(pool_seam.FLASHINFER_WORKSPACE_ENV) == (str(want) if widened else None)


def test_flashinfer_workspace_left_alone_when_set(env):
    env.setenv(pool_seam.FLASHINFER_WORKSPACE_ENV, "123")
    pool_seam._widen_flashinfer_workspace(4096)
    assert os.environ[pool_seam.FLASHINFER_WORKSPACE_ENV] == "123"
    env.delenv(pool_seam.FLASHINFER_WORKSPACE_ENV)
    pool_seam._widen_flashinfer_workspace(1024)
    assert int(os.environ[pool_seam.FLASHINFER_WORKSPACE_ENV]) == (256 + 768) << 20


def test_solver_auto_mode_restores_sglangs_value_when_the_solve_fails(spec_solver, env):
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator

    env.setenv("SGLANG_REPLAYSSM_SPEC_MAX_RUNNING", "auto")
    with pytest.raises(RuntimeError, match="Not enough GPU memory"):
        KVCacheConfigurator._handle_max_mamba_cache(spec_solver.kc, 0.0)
    assert spec_solver.sched().max_running_requests == 48


def test_solver_leaves_a_charged_draft_alone(spec_solver):
    """A draft with its own checkpoint is charged by SGLang (eagle_draft_num_layers): no second charge."""
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator

    s = spec_solver
    s.kc.spec_aux_config.eagle_draft_num_layers = 1
    rest = 1000 * s.per_slot / (1 << 30)
    out = KVCacheConfigurator._handle_max_mamba_cache(s.kc, rest)
    assert out == pytest.approx(_expected(rest, 48, s) * (s.n_attn + 1) / s.n_attn)
