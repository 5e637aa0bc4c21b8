"""Tensor parallelism (TP = 2 and 4): the pool and decode seams per rank, under SGLang's own parallel state.

How: four local processes (this file run as a script, ``python test_tp_sharding.py --worker``) initialise
SGLang 0.5.17's real parallel state with ``init_distributed_environment`` + ``initialize_model_parallel``
on torch.distributed's gloo backend (CPU; NCCL is kept out with SGLang's own ``SGLANG_NCCL_SO_PATH``, so
its PyNccl communicator disables itself as on a machine without GPUs), first as one TP=4 group, then
ranks 0-1 again as a TP=2 group.  Chosen over building the rank geometry by hand because SGLang's model
configs read the rank's head shard from that state (``get_parallel().attn_tp_size`` in
``*Config.mamba2_cache_params``), so each rank gets exactly the cache params a TP server's scheduler gets.

Every rank, under the package's pool and launch-check patches (registry-applied, as a scheduler applies them):

* SGLang's real ``NemotronHConfig`` / ``Qwen3NextConfig`` (tiny ones with odd per-rank heads: Mamba2 H=3
  G=1, GDN HV=3 HK=1; and the full Nemotron-H-8B and Qwen3-Next-80B head layouts) build the rank's
  ``Mamba2CacheParams``; ``plan_ring`` turns them into the rank's ring geometry and the patched
  ``mamba_cache_per_req`` charges that ring;
* a real ``HybridReqToTokenPool`` gets its ring from the patched ``_init_mamba_pool`` (same slots as the
  rank's ``MambaPool``), and the patched ``clear_slots`` / ``copy_from`` reset the rank's cursors;
* SGLang's real pool solver (``KVCacheConfigurator._handle_max_mamba_cache``, patched: spec ring verifier,
  max running requests from memory) sizes the rank's pool from ServerArgs published with ``--tp-size``;
* ``ServerArgs.check_server_args`` (patched) accepts ``--tp-size``;
* the decode seams on the rank's pool ring: SGLang's real ``MambaMixer2`` built sharded for the rank (its
  in_proj / out_proj column / row parallel, out_proj and the single-group gated norm all-reducing over gloo)
  through ``Mamba2AttnBackend.forward``, and a real ``RadixLinearAttention`` with the rank's GDN heads through
  ``HybridLinearAttnBackend`` -> ``GDNAttnBackend``, each stock and then with the staged seam; the outputs
  agree, the cursors move per rank (CPU shims as in ``test_mamba2_decode.py`` / ``test_gdn_decode.py``);
* every torch.distributed call is counted: none while the pool seam plans, allocates, resets and sizes (the
  solver's inputs are the same on every rank, so every rank derives the same pool), and the staged decode
  makes exactly the calls SGLang's stock decode makes (the package adds no cross-rank traffic).
"""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import triton.language as tl

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # eval/ (the real geometries) is imported from the repository root
    sys.path.insert(0, str(REPO))
L = 4                    # ring length (SGLANG_REPLAYSSM_BUFFER_LEN in the workers)
MAMBA_SIZE = 6           # request slots per pool (+ SGLang's dummy slot 0)
TIMEOUT_S = 900


# --------------------------------------------------------------------------------------
# the geometries (global, i.e. as a TP=1 server sees them)
# --------------------------------------------------------------------------------------

def geometries(tp):
    """name -> (SGLang config class, HF config dict) of the models each rank builds."""
    from eval import models as eval_models

    from sglang_replayssm import models as pkg

    q = pkg.config("tiny-qwen3-next")
    q.update(linear_num_key_heads=tp, linear_num_value_heads=3 * tp, linear_key_head_dim=16,
             linear_value_head_dim=16)
    n = pkg.config("tiny-nemotron-h")
    n.update(mamba_num_heads=3 * tp, n_groups=1, mamba_n_groups=1, mamba_head_dim=16, ssm_state_size=16)
    return {
        "gdn-odd": ("Qwen3NextConfig", q),
        "mamba2-odd-g1": ("NemotronHConfig", n),
        "qwen3-next-80b": ("Qwen3NextConfig", eval_models.get("qwen3-next-80b-a3b-e64").config_json()),
        "nemotron-h-8b": ("NemotronHConfig", eval_models.get("nemotron-h-8b").config_json()),
    }


def expected_geom(cfg, tp):
    """The per-rank head layout SGLang shards to (groups widened to tp when tp does not divide them)."""
    if cfg["model_type"] == "qwen3_next":
        return {"num_k_heads": cfg["linear_num_key_heads"] // tp, "num_v_heads": cfg["linear_num_value_heads"] // tp,
                "head_k_dim": cfg["linear_key_head_dim"], "head_v_dim": cfg["linear_value_head_dim"]}
    g = cfg["n_groups"]
    g = g if g % tp == 0 else tp
    return {"nheads": cfg["mamba_num_heads"] // tp, "head_dim": cfg["mamba_head_dim"],
            "dstate": cfg["ssm_state_size"], "ngroups": g // tp}


# --------------------------------------------------------------------------------------
# the worker (one process per rank)
# --------------------------------------------------------------------------------------

_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
                "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "broadcast", "broadcast_object_list",
                "reduce", "gather", "scatter", "send", "recv", "isend", "irecv", "barrier", "batch_isend_irecv")


class _CollectiveCounter:
    """Counts calls of torch.distributed's collectives and point-to-point ops while armed."""

    def __init__(self):
        import torch.distributed as dist

        self.calls = []
        self.armed = False
        for name in _COLLECTIVES:
            real = getattr(dist, name, None)
            if real is not None:
                setattr(dist, name, self._wrap(name, real))

    def _wrap(self, name, real):
        def counted(*a, **k):
            if self.armed:
                self.calls.append(name)
            return real(*a, **k)

        return counted


def _geom_dict(geom):
    from dataclasses import asdict

    return {k: (str(v) if not isinstance(v, int) else v) for k, v in asdict(geom).items()}


def _rank_facts(tp, tmp, counter):
    import torch
    from sglang.srt import configs as sgl_configs
    from sglang.srt.configs.mamba_utils import BaseLinearStateParams
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
    from sglang.srt import runtime_context
    from sglang.srt.runtime_context import get_parallel

    from sglang_replayssm.config import from_env
    from sglang_replayssm.patches import pool as pool_seam
    from sglang_replayssm.ring import ring_bytes_per_slot

    p = get_parallel()
    out = {"parallel": {"tp_size": p.tp_size, "tp_rank": p.tp_rank, "attn_tp_size": p.attn_tp_size,
                        "attn_tp_rank": p.attn_tp_rank}}
    cfg = from_env()
    fget = BaseLinearStateParams.__dict__["mamba_cache_per_req"].fget
    original_per_req = getattr(fget, "__wrapped__", fget)
    assert original_per_req is not fget, "the pool patches are not applied"
    runtime_context.get_context()._server_args = None  # nothing published yet (a previous phase's args)
    counter.calls.clear()
    counter.armed = True
    models = {}
    for name, (cls, hf) in geometries(tp).items():
        kw = {k: v for k, v in hf.items() if k not in ("architectures", "model_type", "torch_dtype")}
        params = getattr(sgl_configs, cls)(**kw).mamba2_cache_params  # reads the rank's attn TP size
        plan = pool_seam.plan_ring(params, cfg, model_config=None)
        rec = {"kind": plan.kind, "geom": _geom_dict(plan.geom), "layers": len(params.layers),
               "temporal": list(params.shape.temporal), "conv": [list(c) for c in params.shape.conv],
               "ring_bytes_per_slot": ring_bytes_per_slot(plan.geom),
               "charged": params.mamba_cache_per_req - original_per_req(params)}
        if name.endswith("-odd") or name.endswith("-g1"):  # allocate the rank's pool: small geometries only
            pool = HybridReqToTokenPool(
                size=4, mamba_size=MAMBA_SIZE, mamba_spec_state_size=4, max_context_len=32, device="cpu",
                enable_memory_saver=False, cache_params=params, mamba_layer_ids=list(params.layers),
                enable_mamba_extra_buffer=False, speculative_num_draft_tokens=None, speculative_eagle_topk=None,
                enable_overlap_schedule=True, start_layer=0)
            ring = pool.mamba_pool.rssm_ring
            temporal = pool.mamba_pool.mamba_cache.temporal
            rec["pool"] = {"ring_geom": _geom_dict(ring.geom), "num_slots": ring.num_slots,
                           "pool_slots": int(temporal.shape[1]), "num_layers": ring.num_layers,
                           "temporal": list(temporal.shape),
                           "ring_shapes": {k: list(t.shape) for k, t in ring.tensors.items()},
                           "slot_bytes": sum(t[0, 0].numel() * t.element_size() for t in ring.tensors.values())}
            ring.write_pos.copy_(torch.arange(ring.num_slots, dtype=torch.int32) % (L - 1) + 1)
            before = ring.write_pos.tolist()
            pool.mamba_pool.clear_slots(torch.tensor([2], dtype=torch.int64))
            temporal.normal_()
            pool.mamba_pool.copy_from(torch.tensor([3]), torch.tensor([5]))
            rec["pool"]["cursors_before"] = before
            rec["pool"]["cursors_after"] = ring.write_pos.tolist()
            rec["pool"]["copied_state"] = bool(torch.equal(temporal[:, 5], temporal[:, 3]))
        models[name] = rec
    out["models"] = models
    out["solver"] = _solve(tp, tmp, original_per_req)
    counter.armed = False
    out["collectives"] = list(counter.calls)
    return out


def _solve(tp, tmp, original_per_req):
    """SGLang's pool solver on this rank (NEXTN, spec ring verifier, max running requests from memory)."""
    from types import SimpleNamespace

    from sglang.srt import runtime_context
    from sglang.srt.configs.hybrid_arch import mambaish_config
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import SpecAuxHiddenStateConfig
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_replayssm import models

    path = models.materialize("tiny-nemotron-h", root=tmp, num_nextn_predict_layers=1, mamba_num_heads=3 * tp,
                              n_groups=1, mamba_n_groups=1, mamba_head_dim=16, ssm_state_size=16)
    args = prepare_server_args(["--model-path", path, "--load-format", "dummy", "--skip-tokenizer-init",
                                "--device", "cpu", "--disable-radix-cache", "--tp-size", str(tp)])
    args.check_server_args()  # patched: TP is accepted
    runtime_context.publish(args, role="test")
    ctx = runtime_context.get_context()
    ctx.override("test: NEXTN as SGLang resolves it", speculative_num_draft_tokens=4, max_running_requests=48)
    mc = args.model_config
    kc = object.__new__(KVCacheConfigurator)
    for name, value in dict(model_config=mc, server_args=args, spec_algorithm=SpeculativeAlgorithm.EAGLE,
                            spec_aux_config=SpecAuxHiddenStateConfig(), mambaish_config=mambaish_config(mc),
                            hybrid_gdn_config=None, ps=SimpleNamespace(pp_size=1, attn_dp_size=1)).items():
        setattr(kc, name, value)
    params = kc.mambaish_config.mamba2_cache_params
    per_slot = int(params.mamba_cache_per_req)
    sched = runtime_context.get_schedule()
    ratio = sched.mamba_full_memory_ratio
    rest_gb = 4e-4  # the same GiB on every rank and at every TP size: a few dozen slots of this geometry
    out = KVCacheConfigurator._handle_max_mamba_cache(kc, rest_gb)
    return {"per_slot": per_slot, "state_per_req": int(original_per_req(params)), "ratio": ratio,
            "rest_gb": rest_gb, "max_running": sched.max_running_requests,
            "max_mamba_cache_size": sched.max_mamba_cache_size, "kv_rest_gb": out,
            "temporal": list(params.shape.temporal), "tp_size_arg": args.tp_size}


SEAM_SCHEDULE = [[2, 5], [5, 2], [2, 5, 4], [4, 2, 5], [5, 2, 4]]  # slot ids per decode step (2 and 5 flush once)


def _mamba2_decode_seam(tp, counter):
    """SGLang's real ``MambaMixer2`` (built sharded for this rank: in_proj/out_proj column/row parallel, the
    rank's 3 of 3*TP heads, one group replicated) decoding through ``Mamba2AttnBackend.forward``: stock, then
    with the staged Mamba2 decode seam on the rank's ring.  Returns both runs' outputs and the torch.distributed
    calls each made (SGLang's own all-reduces: the gated norm's variance of a single group and out_proj)."""
    import contextlib
    import dataclasses
    import types

    import torch
    import sglang.srt.layers.attention.hybrid_linear_attn_backend as hlab
    from sglang.kernels.ops.mamba import causal_conv1d_triton as cct
    from sglang.kernels.ops.mamba.triton_ops import ssu_dispatch
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape
    from sglang.srt.layers.attention.mamba import mamba
    from sglang.srt.layers.attention.mamba.mamba2_metadata import ForwardMetadata, Mamba2Metadata
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.runtime_context import get_parallel

    from sglang_replayssm.patches import mamba2_decode
    from sglang_replayssm.patches.registry import apply, verify
    from sglang_replayssm.ring import ReplayRing

    # CPU shims of tests/patches/test_mamba2_decode.py: SGLang's Triton conv update (bound on CUDA only), a no-op
    # torch.cpu.device, no published server args, the Triton selective_state_update backend
    mamba.causal_conv1d_update_triton = cct.causal_conv1d_update
    torch.cpu.device = lambda index=None: contextlib.nullcontext()
    hlab.get_memory = lambda: types.SimpleNamespace(enable_page_major_kv_layout=False)
    ssu_dispatch._mamba_ssu_backend = ssu_dispatch.TritonSSUBackend()
    H, P, N, hidden = 3 * tp, 16, 16, 32
    shape = Mamba2StateShape.create(tp_world_size=tp, intermediate_size=H * P, n_groups=1, num_heads=H, head_dim=P,
                                    state_size=N, conv_kernel=4)
    params = Mamba2CacheParams(shape=shape, layers=[0], dtype=Mamba2StateDType(conv=torch.float32,
                                                                              temporal=torch.float32))
    gen = torch.Generator().manual_seed(1000 * tp + get_parallel().tp_rank)
    mixer = mamba.MambaMixer2(params, hidden_size=hidden, use_conv_bias=True, use_bias=False, n_groups=1,
                              prefix="layers.0.mixer")
    for p in mixer.parameters():
        p.requires_grad_(False)
        p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    mixer.A.copy_(-(torch.rand(mixer.A.shape, generator=gen) + 0.3))
    init = {"temporal": torch.randn(shape.temporal, generator=gen) * 0.5}
    inputs = [torch.randn(len(s), hidden, generator=torch.Generator().manual_seed(7 + t))  # same on every rank
              for t, s in enumerate(SEAM_SCHEDULE)]

    def run(staged):
        pool = HybridReqToTokenPool(size=8, mamba_size=MAMBA_SIZE, mamba_spec_state_size=8, max_context_len=64,
                                    device="cpu", enable_memory_saver=False, cache_params=params,
                                    mamba_layer_ids=[0], enable_mamba_extra_buffer=False)
        pool.mamba_pool.mamba_cache.temporal[:] = init["temporal"]
        ring = pool.mamba_pool.rssm_ring  # the pool hook's ring of this rank's geometry
        if staged:  # the mixer runs fp32 here: the same geometry with fp32 x/B entries
            ring = ReplayRing(dataclasses.replace(ring.geom, act_dtype=torch.float32), ring.num_layers,
                              ring.num_slots)
            pool.mamba_pool.rssm_ring = ring
        backend = object.__new__(hlab.Mamba2AttnBackend)
        backend.req_to_token_pool, backend.is_draft_worker, backend.enable_unified_memory = pool, False, False
        outs = []
        counter.calls.clear()
        counter.armed = True
        for slots, hs in zip(SEAM_SCHEDULE, inputs):
            fm = ForwardMetadata(query_start_loc=torch.arange(len(slots) + 1, dtype=torch.int32),
                                 mamba_cache_indices=torch.tensor(slots, dtype=torch.int32))
            backend.forward_metadata = Mamba2Metadata.prepare_decode(
                fm, torch.ones(len(slots), dtype=torch.int64), is_target_verify=False, draft_token_num=1)
            fb = types.SimpleNamespace(forward_mode=ForwardMode.DECODE, mamba_track_mask=None)
            with torch.no_grad():
                outs.append(hlab.Mamba2AttnBackend.forward(backend, mixer, hs, None, 0, fb,
                                                           use_triton_causal_conv=True).tolist())
        counter.armed = False
        return {"outs": outs, "collectives": list(counter.calls), "geom": _geom_dict(ring.geom),
                "cursors": ring.write_pos.tolist(), "temporal": pool.mamba_pool.mamba_cache.temporal.tolist()}

    stock = run(staged=False)
    apply(mamba2_decode.PATCHES)
    verify(mamba2_decode.PATCHES)
    seam = run(staged=True)
    return {"stock": stock, "staged": seam, "heads": int(mixer.A.shape[0])}


def _exp(x):
    """``tl.exp`` behind a jit function (decorated in the worker, after TRITON_INTERPRET is set)."""
    return tl.exp(x)


def _gdn_decode_seam(tp, counter):
    """SGLang's real ``RadixLinearAttention`` layer with the rank's heads (``Qwen3NextConfig`` under this rank's
    parallel state: 1 of TP key heads, 3 of 3*TP value heads, as ``qwen3_next.py`` divides them by the attention
    TP size) decoding through ``HybridLinearAttnBackend.forward`` -> ``GDNAttnBackend`` with SGLang's Triton
    kernels: stock, then with the staged GDN decode seam on the rank's ring (the pool hook's)."""
    import dataclasses
    import types

    import torch
    import triton
    import sglang.srt.layers.attention.hybrid_linear_attn_backend as hlab
    import sglang.srt.layers.attention.linear.gdn_backend as gb
    from sglang.kernels.ops.attention.fla import fused_recurrent
    from sglang.srt import configs as sgl_configs
    from sglang.srt.configs.mamba_utils import Mamba2StateDType
    from sglang.srt.layers.attention.linear.utils import LinearAttnKernelBackend
    from sglang.srt.layers.attention.mamba.mamba2_metadata import ForwardMetadata
    from sglang.srt.layers.radix_linear_attention import RadixLinearAttention
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.runtime_context import get_parallel

    from sglang_replayssm.patches import gdn_decode
    from sglang_replayssm.patches.registry import apply, verify
    from sglang_replayssm.ring import ReplayRing

    # the interpreter shim of tests/patches/test_gdn_decode.py: fla binds ``exp = tl.exp`` as a module global
    fused_recurrent.exp = triton.jit(_exp)
    _, hf = geometries(tp)["gdn-odd"]
    c = sgl_configs.Qwen3NextConfig(**{k: v for k, v in hf.items()
                                       if k not in ("architectures", "model_type", "torch_dtype")})
    params = dataclasses.replace(c.mamba2_cache_params, layers=[0],  # one GDN layer, fp32 (tight comparison)
                                 dtype=Mamba2StateDType(conv=torch.float32, temporal=torch.float32))
    attn_tp = get_parallel().attn_tp_size
    hk, hv = c.linear_num_key_heads // attn_tp, c.linear_num_value_heads // attn_tp
    K, V = c.linear_key_head_dim, c.linear_value_head_dim
    qkv = 2 * hk * K + hv * V
    gen = torch.Generator().manual_seed(2000 * tp + get_parallel().tp_rank)
    layer = RadixLinearAttention(0, num_q_heads=hk, num_k_heads=hk, num_v_heads=hv, head_q_dim=K, head_k_dim=K,
                                 head_v_dim=V, conv_weights=torch.randn(qkv, 4, generator=gen) * 0.4,
                                 bias=torch.randn(qkv, generator=gen) * 0.1, activation="silu",
                                 A_log=torch.randn(hv, generator=gen) * 0.5,
                                 dt_bias=torch.randn(hv, generator=gen) * 0.5)
    init = {"temporal": torch.randn(params.shape.temporal, generator=gen) * 0.3,
            "conv": torch.randn(params.shape.conv[0], generator=gen) * 0.5}
    inputs = [tuple(torch.randn(len(s), w, generator=gen) for w in (qkv, hv, hv)) for s in SEAM_SCHEDULE]

    def run(staged):
        pool = HybridReqToTokenPool(size=8, mamba_size=MAMBA_SIZE, mamba_spec_state_size=8, max_context_len=64,
                                    device="cpu", enable_memory_saver=False, cache_params=params,
                                    mamba_layer_ids=[0], enable_mamba_extra_buffer=False)
        cache = pool.mamba_pool.mamba_cache
        cache.temporal[:] = init["temporal"]
        cache.conv[0][:] = init["conv"]
        ring = pool.mamba_pool.rssm_ring
        if staged:  # fp32 activations here: the same geometry with an fp32 k ring
            ring = ReplayRing(dataclasses.replace(ring.geom, act_dtype=torch.float32), ring.num_layers,
                              ring.num_slots)
            pool.mamba_pool.rssm_ring = ring
        backend = object.__new__(gb.GDNAttnBackend)
        backend.req_to_token_pool, backend.is_draft_worker, backend.enable_unified_memory = pool, False, False
        backend.kernel_dispatcher = gb.GDNKernelDispatcher(LinearAttnKernelBackend.TRITON,
                                                           LinearAttnKernelBackend.TRITON)
        hybrid = object.__new__(hlab.HybridLinearAttnBackend)
        hybrid.full_attn_layers, hybrid.linear_attn_backend, hybrid.full_attn_backend = [3], backend, None
        outs = []
        counter.calls.clear()
        counter.armed = True
        for slots, (mixed, a, b) in zip(SEAM_SCHEDULE, inputs):
            backend.forward_metadata = ForwardMetadata(
                query_start_loc=torch.arange(len(slots) + 1, dtype=torch.int32),
                mamba_cache_indices=torch.tensor(slots, dtype=torch.int32))
            fb = types.SimpleNamespace(forward_mode=ForwardMode.DECODE, mamba_track_mask=None,
                                       batch_size=len(slots))
            with torch.no_grad():
                out = hybrid.forward(layer=layer, forward_batch=fb, mixed_qkv=mixed.clone(), a=a, b=b)
            outs.append(out.tolist())
        counter.armed = False
        return {"outs": outs, "collectives": list(counter.calls), "geom": _geom_dict(ring.geom),
                "cursors": ring.write_pos.tolist(), "temporal": cache.temporal.tolist()}

    stock = run(staged=False)
    apply(gdn_decode.PATCHES)
    verify(gdn_decode.PATCHES)
    return {"stock": stock, "staged": run(staged=True), "heads": [hk, hv]}


def worker(rank, world, ports, out_path):
    os.environ["SGLANG_NCCL_SO_PATH"] = "/nonexistent/libnccl.so.2"  # no NCCL on CPU: PyNccl disables itself
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit: SGLang's kernels on the CPU
    sys.path.insert(0, str(REPO))
    from sglang.srt import runtime_context
    from sglang.srt.distributed import parallel_state as ps

    from sglang_replayssm.patches import launch_check_patches, pool
    from sglang_replayssm.patches.registry import apply, unapply_all, verify

    ps.set_custom_all_reduce(False)
    patches = list(launch_check_patches()) + list(pool.PATCHES)
    apply(patches)
    verify(patches)
    counter = _CollectiveCounter()
    results = {}
    for tp, port in zip((world, 2), ports):
        if rank >= tp:
            break
        ps.init_distributed_environment(world_size=tp, rank=rank, local_rank=rank, backend="gloo",
                                        distributed_init_method=f"tcp://127.0.0.1:{port}")
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, backend="gloo")
        with tempfile.TemporaryDirectory() as tmp:
            results[str(tp)] = _rank_facts(tp, tmp, counter)
        runtime_context.get_context()._server_args = None  # the solver's model is not the seams' models
        results[str(tp)]["seam"] = _mamba2_decode_seam(tp, counter)
        results[str(tp)]["gdn_seam"] = _gdn_decode_seam(tp, counter)
        unapply_all()  # the next phase starts from the launch checks and the pool seam again
        apply(patches)
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()
    Path(out_path).write_text(json.dumps(results))


# --------------------------------------------------------------------------------------
# the tests
# --------------------------------------------------------------------------------------

def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """{tp: [facts of rank 0, 1, ...]} from four gloo processes (TP=4, then TP=2), once per pytest run.

    Under pytest-xdist (``make test``: --dist worksteal) an idle worker steals the tail of a busy one's queue,
    and this file's tests are the tail of the collection: split between two workers, a module fixture would
    start the four processes in each.  The first worker to get here runs them and leaves the facts in the
    run's shared temporary directory (the workers' base directories' parent); the other waits for them."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return _run_ranks(tmp_path_factory.mktemp("tp"))
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent / "tp_sharding_ranks.json"
    with FileLock(str(shared) + ".lock"):
        if not shared.is_file():
            facts = _run_ranks(tmp_path_factory.mktemp("tp"))
            shared.write_text(json.dumps({str(tp): f for tp, f in facts.items()}))
        return {int(tp): f for tp, f in json.loads(shared.read_text()).items()}


def _run_ranks(d):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_REPLAYSSM_")}
    env.pop("SGLANG_PLUGINS", None)
    env.update(SGLANG_REPLAYSSM_ENABLE="1", SGLANG_REPLAYSSM_BUFFER_LEN=str(L), SGLANG_REPLAYSSM_SPEC="1",
               SGLANG_REPLAYSSM_SPEC_MAX_RUNNING="auto", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO)] + [x for x in [os.environ.get("PYTHONPATH")] if x]))
    ports = _free_ports(2)
    procs, outs = [], []
    for rank in range(4):
        out = d / f"rank{rank}.json"
        log = open(d / f"rank{rank}.log", "w")
        procs.append((subprocess.Popen([sys.executable, __file__, "--worker", str(rank), "4", *map(str, ports),
                                        str(out)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        outs.append(out)
    try:
        for p, _ in procs:
            p.wait(timeout=TIMEOUT_S)
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    for rank, (p, _) in enumerate(procs):
        assert p.returncode == 0, f"rank {rank} failed:\n" + (d / f"rank{rank}.log").read_text()[-6000:]
    facts = [json.loads(o.read_text()) for o in outs]
    return {tp: [f[str(tp)] for f in facts if str(tp) in f] for tp in (2, 4)}


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_ranks_run_sglangs_own_parallel_state(ranks, tp):
    got = [r["parallel"] for r in ranks[tp]]
    assert got == [{"tp_size": tp, "tp_rank": i, "attn_tp_size": tp, "attn_tp_rank": i} for i in range(tp)]


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_ring_geometry_is_the_ranks_head_shard(ranks, tp):
    """Every rank plans a ring of its own shard (H/TP heads; Mamba2 groups widened and replicated as SGLang
    does when TP does not divide them), the same on every rank; the pool shapes agree with it."""
    for name, (_, hf) in geometries(tp).items():
        recs = [r["models"][name] for r in ranks[tp]]
        assert all(rec == recs[0] for rec in recs), f"{name}: ranks differ"
        rec = recs[0]
        want = expected_geom(hf, tp)
        assert {k: rec["geom"][k] for k in want} == want, name
        assert rec["geom"]["buffer_len"] == L
        if rec["kind"] == "gdn":
            assert rec["temporal"] == [want["num_v_heads"], want["head_v_dim"], want["head_k_dim"]]
        else:
            assert rec["temporal"] == [want["nheads"], want["head_dim"], want["dstate"]]
    # the odd per-rank head counts the kernels must serve
    assert ranks[tp][0]["models"]["gdn-odd"]["geom"]["num_v_heads"] == 3
    assert ranks[tp][0]["models"]["gdn-odd"]["geom"]["num_k_heads"] == 1
    assert ranks[tp][0]["models"]["mamba2-odd-g1"]["geom"]["nheads"] == 3
    assert ranks[tp][0]["models"]["mamba2-odd-g1"]["geom"]["ngroups"] == 1


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_pool_ring_per_rank(ranks, tp):
    """The patched ``_init_mamba_pool`` gives each rank's real pool a ring of the rank's geometry over the
    pool's own slots; ``clear_slots`` / ``copy_from`` reset exactly the rank's cursors they touch."""
    for name in ("gdn-odd", "mamba2-odd-g1"):
        for rank, r in enumerate(ranks[tp]):
            rec = r["models"][name]
            pool = rec["pool"]
            assert pool["ring_geom"] == rec["geom"], (name, rank)
            assert pool["num_slots"] == pool["pool_slots"] == MAMBA_SIZE + 1
            assert pool["num_layers"] == rec["layers"] == pool["temporal"][0]
            g = rec["geom"]
            if rec["kind"] == "gdn":
                want = {"d": [g["num_v_heads"], L, g["head_v_dim"]], "k": [g["num_k_heads"], L, g["head_k_dim"]],
                        "g": [g["num_v_heads"], L]}
            else:
                want = {"x": [g["nheads"], L, g["head_dim"]], "B": [g["ngroups"], L, g["dstate"]],
                        "dt": [g["nheads"], L]}
            assert pool["ring_shapes"] == {k: [rec["layers"], MAMBA_SIZE + 1, *v] for k, v in want.items()}
            assert pool["slot_bytes"] == rec["ring_bytes_per_slot"]
            after = list(pool["cursors_before"])
            after[2] = after[5] = 0
            assert pool["cursors_after"] == after and pool["copied_state"]


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_pool_sizing_charges_the_ranks_ring(ranks, tp):
    """SGLang's per-request mamba bytes (patched) carry each rank's ring; the GDN ring (and a Mamba2 ring whose
    groups divide) splits exactly by TP, a widened single group is replicated; SGLang's solver, fed the same
    budget on every rank, sizes the same pool on every rank from the rank's per-slot bytes."""
    one = ranks[2][0]["models"]  # per-rank bytes at TP=2 scale back to TP=1 where the heads split evenly
    for name, rec in ranks[tp][0]["models"].items():
        assert rec["charged"] == rec["ring_bytes_per_slot"] * rec["layers"] > 0, name
    for name in ("qwen3-next-80b", "nemotron-h-8b"):  # 16/32 heads, 8 groups: even shards at TP 2 and 4
        assert ranks[tp][0]["models"][name]["ring_bytes_per_slot"] * tp == one[name]["ring_bytes_per_slot"] * 2
    m = ranks[tp][0]["models"]["mamba2-odd-g1"]
    g = m["geom"]  # the one group's B entries are held by every rank
    x_dt = g["nheads"] * L * g["head_dim"] * 2 + g["nheads"] * L * 4
    assert m["ring_bytes_per_slot"] == x_dt + g["ngroups"] * L * g["dstate"] * 2
    solves = [r["solver"] for r in ranks[tp]]
    assert all(s == solves[0] for s in solves), "ranks solved different pools"
    s = solves[0]
    assert s["tp_size_arg"] == tp and s["temporal"][0] == 3  # the rank's 3 heads of 3*TP
    assert s["per_slot"] > s["state_per_req"]  # the spec ring is charged
    budget = s["rest_gb"] * s["ratio"] / (1 + s["ratio"]) * (1 << 30)
    fit = int((budget - s["per_slot"]) // s["per_slot"])
    assert 0 < fit < 48  # memory-bound at this budget (below SGLang's speculative default of 48)
    assert s["max_running"] == s["max_mamba_cache_size"] == fit


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_mamba2_decode_seam_per_rank(ranks, tp):
    """The staged Mamba2 decode seam on each rank's ring gives SGLang's own decode outputs (the sharded mixer's,
    after out_proj's all-reduce: the same on every rank) and makes exactly SGLang's torch.distributed calls."""
    import torch

    visits = {}
    for slots in SEAM_SCHEDULE:
        for s in slots:
            visits[s] = visits.get(s, 0) + 1
    want_cursors = [visits.get(s, 0) % L for s in range(MAMBA_SIZE + 1)]
    assert max(visits.values()) > L  # a flush happened and entries are pending
    for rank, r in enumerate(ranks[tp]):
        seam = r["seam"]
        stock, staged = seam["stock"], seam["staged"]
        assert seam["heads"] == 3 and staged["geom"]["nheads"] == 3 and staged["geom"]["ngroups"] == 1
        for t, (a, b) in enumerate(zip(staged["outs"], stock["outs"])):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=2e-4, atol=2e-4,
                                       msg=f"tp {tp} rank {rank} step {t}")
        assert staged["cursors"] == want_cursors and not any(stock["cursors"])
        assert stock["collectives"] and staged["collectives"] == stock["collectives"], (rank, staged["collectives"])
        untouched = [s for s in range(MAMBA_SIZE + 1) if s not in visits]
        assert torch.equal(torch.tensor(staged["temporal"])[:, untouched],
                           torch.tensor(stock["temporal"])[:, untouched])
        rank0 = ranks[tp][0]["seam"]["stock"]["outs"][-1]  # out_proj all-reduced: every rank holds the sum
        torch.testing.assert_close(torch.tensor(stock["outs"][-1]), torch.tensor(rank0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_gdn_decode_seam_per_rank(ranks, tp):
    """The staged GDN decode seam accepts each rank's layer (1 key / 3 value heads) against the rank's ring and
    gives SGLang's own decode outputs; neither path makes a torch.distributed call."""
    import torch

    visits = {}
    for slots in SEAM_SCHEDULE:
        for s in slots:
            visits[s] = visits.get(s, 0) + 1
    for rank, r in enumerate(ranks[tp]):
        seam = r["gdn_seam"]
        stock, staged = seam["stock"], seam["staged"]
        assert seam["heads"] == [1, 3]
        assert (staged["geom"]["num_k_heads"], staged["geom"]["num_v_heads"]) == (1, 3)
        for t, (a, b) in enumerate(zip(staged["outs"], stock["outs"])):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=2e-5, atol=2e-5,
                                       msg=f"tp {tp} rank {rank} step {t}")
        assert staged["cursors"] == [visits.get(s, 0) % L for s in range(MAMBA_SIZE + 1)]
        assert stock["collectives"] == staged["collectives"] == []
        untouched = [s for s in range(MAMBA_SIZE + 1) if s not in visits]
        assert torch.equal(torch.tensor(staged["temporal"])[:, untouched],
                           torch.tensor(stock["temporal"])[:, untouched])


def test_tp_no_cross_rank_traffic(ranks):
    """Planning, allocating, clearing, copying and sizing the rings made no torch.distributed call on any rank,
    and no module of the package imports torch.distributed or SGLang's distributed layer."""
    for tp, rs in ranks.items():
        for rank, r in enumerate(rs):
            assert r["collectives"] == [], (tp, rank, r["collectives"])
    offenders = []
    for path in sorted((REPO / "sglang_replayssm").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for n in names:
                if n.startswith(("torch.distributed", "sglang.srt.distributed")):
                    offenders.append(f"{path.relative_to(REPO)}: {n}")
    assert offenders == []


def test_tp_server_args_accept_tensor_parallelism_only():
    """TP is accepted; PP, DP attention and context parallelism are still refused, each naming its flag."""
    from types import SimpleNamespace

    from sglang_replayssm.config import ReplaySSMConfig
    from sglang_replayssm.patches.server_args import unsupported_reasons

    cfg = ReplaySSMConfig(enable=True, buffer_len=4)
    base = dict(tp_size=1, pp_size=1, enable_dp_attention=False, attn_cp_size=1, dcp_size=1, dp_size=1)
    for tp in (2, 4, 8):
        assert unsupported_reasons(SimpleNamespace(**{**base, "tp_size": tp}), cfg) == []
    cases = {"pp_size": (2, "--pp-size 2"), "enable_dp_attention": (True, "--enable-dp-attention"),
             "attn_cp_size": (2, "--attn-cp-size 2"), "dcp_size": (2, "--dcp-size 2")}
    for field, (value, flag) in cases.items():
        reasons = unsupported_reasons(SimpleNamespace(**{**base, "tp_size": 2, field: value}), cfg)
        assert len(reasons) == 1 and reasons[0].startswith(flag) and "--tp-size" in reasons[0], (field, reasons)


if __name__ == "__main__" and len(sys.argv) == 7 and sys.argv[1] == "--worker":
    worker(int(sys.argv[2]), int(sys.argv[3]), [int(sys.argv[4]), int(sys.argv[5])], sys.argv[6])
