"""Seam: SGLang's hybrid state pool -- ReplaySSM ring state per mamba slot (no math).

A replay-ring seam: listed by :func:`sglang_replayssm.patches.replay_ring_patches`, applied by
the launcher unless ``--replayssm-replay-ring false`` (run end to end on an H200).

Interface for the decode seams (keep stable)
--------------------------------------------
::

    ring = getattr(req_to_token_pool.mamba_pool, "rssm_ring", None)

``None`` means "no ring for this pool, run SGLang's own path": ReplaySSM disabled
(``SGLANG_REPLAYSSM_ENABLE`` unset), the model's SSM type not in
``SGLANG_REPLAYSSM_SSM_TYPES``, a pool without SSM state (Kimi/KDA, lightning,
conv-only LFM2/ZAYA layers), or a multi-layer-EAGLE draft clone.  Otherwise ``ring``
is a :class:`sglang_replayssm.ring.ReplayRing`:

* ``ring.kind`` -- ``"mamba2"`` or ``"gdn"``; ``ring.geom`` -- the per-TP-rank
  :class:`Mamba2RingGeometry` / :class:`GDNRingGeometry`; ``ring.buffer_len`` -- L.
* ``ring.num_layers == len(mamba_layer_ids)`` of the pool and ``ring.layer(i)`` takes
  the *pool* layer index ``i = req_to_token_pool.mamba_map[layer_id]`` (the index
  SGLang's ``mamba2_layer_cache`` uses).  It returns views ``[S, ...]``: Mamba2
  ``x [S,H,L,P]``, ``B [S,G,L,N]`` (activation dtype), ``dt [S,H,L]`` fp32; GDN
  ``d [S,HV,L,V]`` (state dtype), ``k [S,Hk,L,K]`` (activation dtype), ``g [S,HV,L]`` fp32.
* ``ring.num_slots == mamba_pool.size + 1``: the same *physical* slot ids as
  ``MambaPool`` (slot 0 is SGLang's dummy/padding slot), same device.
* ``ring.write_pos [S] int32``: number of valid ring entries of each slot.

Hooks (targets identical in SGLang 0.5.15, 0.5.17 and 0.5.23)
--------------------------------------------------------------
1. AROUND ``HybridReqToTokenPool._init_mamba_pool``: builds the ring from the pool's
   ``cache_params`` and ``mamba_layer_ids`` and sets ``mamba_pool.rssm_ring`` (never an
   upstream ``replayssm_*`` name: ``copy_from``, the radix caches and the GDN backend
   branch on those).  Allocated inside the pool's memory-saver region (like the pool's
   own tensors), on the device of ``mamba_cache.temporal``.

   *SSM type.*  Mamba2 models (NemotronH, FalconH1, Granite-4) and GDN models
   (Qwen3-Next, Qwen3.5) both hand the pool a ``Mamba2CacheParams`` whose temporal
   shape is ``[H, P, N]`` resp. ``[HV, V, K]``, so the shapes alone cannot tell them
   apart.  The type comes from SGLang's own predicates on the target model's
   ``ModelConfig`` (``configs.hybrid_arch.hybrid_gdn_config`` / ``mamba2_config``;
   0.5.15: the same-named ``ModelRunner`` properties).  The ``ModelConfig`` is read,
   never built, from the process's published ``ServerArgs``
   (``runtime_context.get_server_args().model_config``: ``ServerArgs.get_model_config``
   caches it during ``__post_init__`` in the launcher and it is pickled to the
   scheduler; 0.5.15 and 0.5.17; 0.5.23: ``_model_config``, the memo of
   ``arg_groups.model_config_of``, when one was built for the record's ``model_path``).
   Without it (no memo in 0.5.23; unit tests) the type falls back to the shape: only the Qwen3-Next family records
   ``conv_shard_groups`` (``[key_dim, key_dim, value_dim]``) -> GDN, anything else ->
   Mamba2.  A wrong guess must not compute silently: a decode seam checks
   ``ring.kind``/``ring.geom`` against its backend and raises (``mamba2_decode`` does;
   the GDN seam must too).

   *Groups.*  ``Mamba2StateShape.create`` sets ``conv_dim = intermediate + 2*G*N`` with
   ``intermediate = H*P`` (GDN: ``HV*V + 2*Hk*K``; ``n_groups`` is widened first when TP
   does not divide it) and the per-rank conv state is ``(conv_dim/tp, K_conv-1)``.
   Hence, per TP rank, ``G = (conv[0][0] - H*P) / (2*N)`` (GDN: ``Hk = (conv[0][0] -
   HV*V) / (2*K)``), which is the group count the mixer uses after widening.  A
   remainder, a non-positive G, or ``H % G != 0`` raises :class:`RingGeometryError`.

   *Tensor parallelism.*  Every TP rank runs this hook on its own pool, whose
   ``cache_params`` SGLang built for the rank's head shard (``get_parallel().attn_tp_size``
   in each ``*Config.mamba2_cache_params``), so the ring, the byte charge (hook 4) and the
   solver (hook 5) all see the rank's geometry.  Nothing here talks to the other ranks:
   they schedule the same slots, and the solver's inputs are the same on every rank
   (SGLang min-reduces the free memory first), so every rank sizes the same pool.

   *Dtypes.*  Activation dtype (x/B rings, GDN k ring) = the model dtype SGLang runs
   the layers in, ``ModelConfig.dtype`` (``configs/model_config.py``
   ``_get_and_verify_dtype``: ``--dtype``, "auto" -> the checkpoint's ``torch_dtype``,
   fp32 checkpoints -> fp16).  Fallbacks: an explicit ``ServerArgs.dtype``, then bf16.
   State dtype (GDN d ring) = the dtype of ``mamba_cache.temporal`` (=
   ``cache_params.dtype.temporal``, ``--mamba-ssm-dtype``).  dt/g rings are fp32.

   *Draft clones.*  ``clone_with_new_mamba`` (0.5.17+, Inkling multi-layer EAGLE heads)
   is ``copy.copy(target_pool)`` followed by ``_init_mamba_pool`` on the copy.  The hook
   stamps ``id(self)`` into ``self.rssm_ring_owner`` on every pool it sees; a copy
   arrives carrying its target's stamp (a different id), so it gets no ring.

2. AFTER ``MambaPool.clear_slots(indices)``: ``write_pos[indices] = 0`` with
   :meth:`ReplayRing.reset_nosync` (no bounds check, no host sync: the deferred clear
   runs on the forward stream).  Stale ring entries are masked by the cursor, never
   zeroed.

3. AFTER ``MambaPool.copy_from(src, dst)``: ``write_pos[dst] = 0`` (the ring is not
   copied).  Callers (0.5.17):

   * deferred COW on a radix prefix hit (``ModelRunner._maybe_execute_deferred_mamba_
     cow_and_clear``): src is a tree node's slot, dst the request's fresh slot, and an
     *extend* follows at once.  Extend runs SGLang's chunked scan, which reads only
     ``temporal``; so dst is correct only if src's ring is empty, and dst's cursor
     must be 0 once the extend has folded everything into the new checkpoint.
     Copying src's entries would leave a stale non-zero cursor behind that extend.
   * ``cache_unfinished_req`` (radix / unified ``MambaComponent``): src is the live
     slot right after an extend, dst the new tree node's slot, copied from the
     scheduler.  Under the overlap scheduler the next forward, which may already
     decode this request and append its token to src's ring, is launched before this
     result is processed (``Scheduler.event_loop_overlap``; the copy is only fenced
     behind that forward's reads by ``_apply_war_barrier``; read, not run).  The
     checkpoint is not touched by that decode (the first decode after an extend has
     ``write_pos = 0`` and is never a flush for L >= 2), so ``temporal`` plus an empty
     ring is exactly the cached prefix's state; a ring copy would race with the
     append or include a token that is not part of the prefix.
   * multi-layer-EAGLE draft pools: no ring, nothing to do.

   Every caller therefore requires a flushed source, as SGLang's own GDN ring does
   (its ``copy_from`` docstring).  What keeps tree-node slots flushed is the radix
   finish flush (a separate seam: a slot donated by ``cache_finished_req`` may hold
   ring entries).  With SGLang's ``SGLANG_DEBUG_MEMORY_POOL`` set
   (``MambaPool.debug_memory_pool``), the hook checks ``write_pos[src] == 0`` (syncs)
   and raises :class:`UnflushedCopyError` otherwise.

4. PROPERTY ``BaseLinearStateParams.mamba_cache_per_req`` (registry kind
   ``property_after``): adds ``ring_bytes_per_slot(geom) * len(layers)`` (the same
   geometry the pool hook allocates) so that ``_handle_max_mamba_cache`` sizes the
   slot count with the rings included.  The 4-byte cursor per slot is not charged.
   Under speculative decoding SGLang's solver also multiplies the per-request size
   by the draft tokens for its verify scratch, so the ring is charged there too
   (conservative).

5. Speculative decoding (``_init_mamba_pool`` got ``speculative_num_draft_tokens`` D and
   ``SGLANG_REPLAYSSM_SPEC`` is on): the ring is a *spec ring* of length ``L + T`` with
   ``T = max(D, --max-speculative-num-draft-tokens)`` and origin/flush cursors
   (``kernels/spec_cursor.py``), and ``MambaPool.__init__`` runs with its module's ``torch``
   swapped for :class:`_SnapshotFreeTorch`, so that the per-draft SSM snapshot buffer
   ``intermediate_ssm`` is created with zero slots (the ring verifier neither reads nor
   writes it; the conv windows, which SGLang's conv rollback needs, are allocated as
   usual).  The hook checks afterwards that exactly that allocation was intercepted.
   AROUND SGLang's pool solver (``KVCacheConfigurator._handle_max_mamba_cache``, 0.5.17+;
   ``ModelRunnerKVCacheMixin.handle_max_mamba_cache``, 0.5.15): speculation is hidden
   (``spec_algorithm`` NONE for the call; a test checks per release that the solver reads
   speculation only there), so no snapshot memory is reserved and the whole mamba budget
   becomes slots (each charged with its spec ring by hook 4): more concurrent requests.

Not here (other seams of the slot lifecycle): flushing a slot before radix donation on
finish, cursor reset for extend rows on a slot with ring entries (retract/recompute),
the extra_buffer track slots (``prefix_track``), and refusing the modes that move state around
``clear_slots``/``copy_from`` (the int8 checkpoint pool, HiCache, PD, unified memory).
"""

from __future__ import annotations

import logging
import weakref
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Optional, Tuple, Union

import torch

from ..config import ReplaySSMConfig, current
from ..ring import GDNRingGeometry, Mamba2RingGeometry, ReplayRing, ring_bytes_per_slot
from ._cursor import RING_ATTR
from .registry import Patch

logger = logging.getLogger("sglang_replayssm.patches")

MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"
INIT_TARGET = MEMORY_POOL + ".HybridReqToTokenPool._init_mamba_pool"
CLEAR_TARGET = MEMORY_POOL + ".MambaPool.clear_slots"
COPY_TARGET = MEMORY_POOL + ".MambaPool.copy_from"
CHARGE_TARGET = "sglang.srt.configs.mamba_utils.BaseLinearStateParams.mamba_cache_per_req"
SOLVER_TARGET = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._handle_max_mamba_cache"
SOLVER_TARGET_0515 = "sglang.srt.model_executor.model_runner_kv_cache_mixin.ModelRunnerKVCacheMixin.handle_max_mamba_cache"

OWNER_ATTR = "rssm_ring_owner"     # on HybridReqToTokenPool: id() of the pool that ran the init hook

_SERVER_DTYPES = {
    "half": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float": torch.float32, "float32": torch.float32,
}
_AUTO = object()

Geometry = Union[Mamba2RingGeometry, GDNRingGeometry]


class RingGeometryError(ValueError):
    """The pool's cache shapes do not describe a Mamba2/GDN layer consistently."""


class UnflushedCopyError(RuntimeError):
    """``MambaPool.copy_from`` was given a source slot whose ring is not empty."""


# --------------------------------------------------------------------------------------
# what ring a pool gets (pure functions of cache_params + the model's config)
# --------------------------------------------------------------------------------------

def published_config() -> Tuple[Optional[Any], Optional[Any]]:
    """(published ServerArgs, the target model's ``ModelConfig`` cached on it), each or None.

    Read-only: never builds a ModelConfig (that would re-read the checkpoint's config)."""
    try:
        from sglang.srt.runtime_context import get_server_args

        server_args = get_server_args()
    except Exception:  # not published in this process (unit tests)
        return None, None
    cached = getattr(server_args, "__dict__", {})
    model_config = cached.get("model_config")
    if model_config is None and cached.get("_model_config_built_from") == getattr(server_args, "model_path", None):
        model_config = cached.get("_model_config")  # 0.5.23: arg_groups' model_config_of memo, for model_path
    return server_args, model_config


def kind_from_model_config(model_config) -> Optional[str]:
    """``"gdn"`` / ``"mamba2"`` / ``None`` (another linear-attention family), by SGLang's predicates."""
    try:
        from sglang.srt.configs import hybrid_arch  # 0.5.17, 0.5.23

        gdn = hybrid_arch.hybrid_gdn_config(model_config)
        mamba2 = hybrid_arch.mamba2_config(model_config)
    except ImportError:  # 0.5.15: the same predicates are ModelRunner properties
        from types import SimpleNamespace

        from sglang.srt.model_executor.model_runner import ModelRunner

        shim = SimpleNamespace(model_config=model_config, is_draft_worker=False)
        gdn = ModelRunner.hybrid_gdn_config.fget(shim)
        mamba2 = ModelRunner.mamba2_config.fget(shim)
    if gdn is not None:
        return "gdn"
    if mamba2 is not None:
        return "mamba2"
    return None


def kind_from_shape(shape) -> str:
    """Fallback without a ModelConfig: the Qwen3-Next family records conv_shard_groups."""
    return "gdn" if getattr(shape, "conv_shard_groups", None) else "mamba2"


def activation_dtype(model_config, server_args) -> Tuple[torch.dtype, str]:
    """(dtype the model's layers run in, where it came from)."""
    d = getattr(model_config, "dtype", None)
    if isinstance(d, torch.dtype):
        return d, "ModelConfig.dtype"
    s = str(getattr(server_args, "dtype", "auto") or "auto").lower()
    if s in _SERVER_DTYPES:
        return _SERVER_DTYPES[s], "ServerArgs.dtype"
    return torch.bfloat16, "default bf16 (no ModelConfig published)"


def derive_groups(conv_dim: int, nheads: int, head_dim: int, dstate: int, what: str = "G") -> int:
    """Groups per TP rank from the per-rank conv channels: (conv_dim - H*P) / (2*N)."""
    rest = conv_dim - nheads * head_dim
    if dstate <= 0 or rest <= 0 or rest % (2 * dstate):
        raise RingGeometryError(
            f"cannot derive {what} from the pool's conv state: conv channels {conv_dim} - "
            f"{nheads}*{head_dim} = {rest} is not a positive multiple of 2*{dstate}")
    groups = rest // (2 * dstate)
    if nheads % groups:
        raise RingGeometryError(f"derived {what}={groups} does not divide the {nheads} heads")
    return groups


@dataclass(frozen=True)
class RingPlan:
    kind: str
    geom: Geometry
    kind_source: str
    dtype_source: str


def plan_ring(cache_params, cfg: ReplaySSMConfig, state_dtype: Optional[torch.dtype] = None,
              model_config: Any = _AUTO) -> Optional[RingPlan]:
    """The ring geometry a pool built from ``cache_params`` gets, or None (no ring).

    ``state_dtype`` defaults to ``cache_params.dtype.temporal``; ``model_config``
    defaults to the published one (:func:`published_config`).
    """
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams

    if not isinstance(cache_params, Mamba2CacheParams):
        return None  # KimiLinearCacheParams (KDA), Inkling conv params, ...
    shape = cache_params.shape
    temporal = tuple(shape.temporal)
    if len(temporal) != 3 or min(temporal) <= 0:
        return None  # no SSM state (LFM2 / ZAYA conv-only layers)
    server_args = None
    if model_config is _AUTO:
        server_args, model_config = published_config()
    if model_config is not None:
        kind, kind_source = kind_from_model_config(model_config), "model config"
        if kind is None:
            return None  # lightning / other linear-attention families
    else:
        kind, kind_source = kind_from_shape(shape), "pool shapes (no ModelConfig published)"
    if kind not in cfg.ssm_types:
        return None
    act, dtype_source = activation_dtype(model_config, server_args)
    state = state_dtype or cache_params.dtype.temporal
    if len(shape.conv) != 1:
        raise RingGeometryError(f"{kind} pool with {len(shape.conv)} conv states; expected one")
    conv_dim = int(shape.conv[0][0])
    H, P, N = (int(x) for x in temporal)
    try:
        if kind == "mamba2":
            G = derive_groups(conv_dim, H, P, N, "Mamba2 n_groups per rank")
            geom: Geometry = Mamba2RingGeometry(nheads=H, head_dim=P, dstate=N, ngroups=G,
                                                buffer_len=cfg.buffer_len, act_dtype=act)
        else:  # GDN: temporal [HV, V, K], conv = q, k (Hk*K each) and v (HV*V)
            Hk = derive_groups(conv_dim, H, P, N, "GDN key heads per rank")
            geom = GDNRingGeometry(num_k_heads=Hk, num_v_heads=H, head_k_dim=N, head_v_dim=P,
                                   buffer_len=cfg.buffer_len, act_dtype=act, state_dtype=state)
    except ValueError as e:
        if isinstance(e, RingGeometryError):
            raise
        raise RingGeometryError(f"{kind} ring geometry: {e}") from None
    return RingPlan(kind, geom, kind_source, dtype_source)


def spec_window(server_args, cfg: ReplaySSMConfig) -> Optional[int]:
    """The verify window T a spec ring must hold (1 + draft tokens, the largest the server
    may use), or None when the server does not speculate or ``cfg.spec`` is off."""
    if server_args is None or not cfg.spec:
        return None
    algo = getattr(server_args, "speculative_algorithm", None)
    if not algo or str(algo).upper() == "NONE":
        return None
    sizes = [getattr(server_args, name, None) for name in
             ("speculative_num_draft_tokens", "max_speculative_num_draft_tokens")]
    sizes = [int(x) for x in sizes if x]
    if not sizes:
        raise RingGeometryError(f"--speculative-algorithm {algo} without --speculative-num-draft-tokens: "
                                "the spec ring cannot be sized")
    return max(sizes)


def build_ring(mamba_pool, cache_params, mamba_layer_ids, cfg: ReplaySSMConfig,
               model_config: Any = _AUTO, window: Any = _AUTO) -> Optional[ReplayRing]:
    """The ring for an already built ``MambaPool`` (same slots, layers and device), or None.

    ``window``: the verify window of a spec ring (None: a standard-decode ring); by default
    from the published server args (:func:`spec_window`)."""
    temporal = mamba_pool.mamba_cache.temporal
    plan = plan_ring(cache_params, cfg, state_dtype=temporal.dtype, model_config=model_config)
    if window is _AUTO:
        window = spec_window(published_config()[0], cfg)
    num_layers = len(mamba_layer_ids)
    if plan is None or num_layers == 0:
        return None
    if temporal.shape[0] != num_layers:
        raise RingGeometryError(f"pool holds {temporal.shape[0]} layers but was given {num_layers} layer ids")
    num_slots = int(temporal.shape[1])
    region = nullcontext()
    adapter = getattr(mamba_pool, "memory_saver_adapter", None)
    if adapter is not None:
        from sglang.srt.constants import GPU_MEMORY_TYPE_KV_CACHE

        region = adapter.region(GPU_MEMORY_TYPE_KV_CACHE)
    with region:
        ring = ReplayRing(plan.geom, num_layers, num_slots, device=temporal.device, spec_window=window)
    ring_slot, state_slot = ring_slot_share(ring, temporal)
    logger.info("sglang_replayssm: %s %s ring on the mamba pool (type from %s; activation dtype from %s): %s, "
                "ring length %d, %d layer(s) x %d slots, %.2f MiB: %.2f MiB a slot beside its %.2f MiB SSM state, so "
                "the same memory holds %.1f%% fewer slots (and running requests) than without the ring", plan.kind,
                "standard-decode" if window is None else f"spec (verify window {window})", plan.kind_source,
                plan.dtype_source, plan.geom, ring.ring_len, num_layers, num_slots, ring.nbytes() / (1 << 20),
                ring_slot / (1 << 20), state_slot / (1 << 20), 100.0 * ring_slot / max(ring_slot + state_slot, 1))
    if plan.kind == "gdn" and temporal.dtype != torch.float32 and window is None:  # the decode kernel's cost
        logger.warning("sglang_replayssm: GDN layers with a %s SSM state: the replay decode kernel gains little "
                       "or nothing over SGLang's there (H200, Qwen3-Next geometry: 1.04x at batch 256, 0.97x at 32, "
                       "0.81x at 1, eval/results/kernels-h200.md; it gains with an fp32 state, "
                       "--mamba-ssm-dtype float32)", str(temporal.dtype).split(".")[-1])
    return ring


def ring_slot_share(ring, temporal: torch.Tensor) -> Tuple[int, int]:
    """(ring bytes, SSM state bytes) per pool slot, all layers: a slot of ``state + ring`` bytes means a pool of
    the same memory holds ``ring / (state + ring)`` fewer slots than stock's (honest slot accounting in the log)."""
    slots = max(int(temporal.shape[1]), 1)
    state = temporal.numel() // slots * temporal.element_size()
    return ring.nbytes() // slots, state


# --------------------------------------------------------------------------------------
# hooks
# --------------------------------------------------------------------------------------

def _arg(args, kwargs, name: str, pos: int):
    if name in kwargs:
        return kwargs[name]
    if len(args) > pos:
        return args[pos]
    raise TypeError(f"sglang_replayssm pool hook: argument {name!r} not passed")


def _opt_arg(args, kwargs, name: str, pos: int, default=None):
    try:
        return _arg(args, kwargs, name, pos)
    except TypeError:
        return default


class _SnapshotFreeTorch:
    """Stand-in for ``memory_pool``'s ``torch`` global while one ``MambaPool`` is built.

    Every attribute is torch's, except that the per-draft SSM snapshot buffer -- the one
    6-D ``torch.zeros(size=(layers, slots, draft_tokens, *temporal_shape))`` call of
    ``MambaPool.__init__`` (0.5.15 / 0.5.17 / 0.5.23) -- gets zero slots: the ring
    verifier never reads or writes it, and SGLang's pool solver was told not to budget it
    (:func:`handle_max_mamba_cache_around`).  The conv windows are allocated as usual."""

    def __init__(self, real, temporal_shape, device):
        self._real = real
        self._shape = tuple(int(x) for x in temporal_shape)
        self._device = device
        self.skipped = 0

    def __getattr__(self, name):
        return getattr(self._real, name)

    def zeros(self, *args, **kwargs):
        size = kwargs.get("size")
        if not args and isinstance(size, (tuple, list)) and len(size) == 6 \
                and tuple(int(x) for x in size[3:]) == self._shape:
            self.skipped += 1
            return self._real.empty((size[0], 0) + tuple(size[2:]), dtype=kwargs.get("dtype"), device=self._device)
        return self._real.zeros(*args, **kwargs)


def _build_pool_without_snapshots(original, self, cache_params, device, args, kwargs):
    """Run ``_init_mamba_pool`` with the snapshot allocation suppressed; verify it was."""
    import sys

    mod = sys.modules[MEMORY_POOL]
    real = mod.torch
    proxy = _SnapshotFreeTorch(real, cache_params.shape.temporal, device)
    mod.torch = proxy
    try:
        result = original(self, *args, **kwargs)
    finally:
        mod.torch = real
    inter = getattr(self.mamba_pool.mamba_cache, "intermediate_ssm", None)
    if proxy.skipped != 1 or inter is None or inter.shape[1] != 0:
        from .registry import PatchError, sglang_version

        raise PatchError(
            f"{MEMORY_POOL}.MambaPool.__init__ (SGLang {sglang_version()}) did not allocate its per-draft SSM "
            f"snapshots through the expected torch.zeros call ({proxy.skipped} intercepted): the pool solver was "
            "told not to budget them, so running on would over-commit GPU memory")
    logger.info("sglang_replayssm: per-draft SSM snapshot buffer not allocated (the ring verifier keeps none)")
    return result


def init_mamba_pool_around(original, self, *args, **kwargs):
    """AROUND ``HybridReqToTokenPool._init_mamba_pool``: attach ``mamba_pool.rssm_ring``; with a spec
    ring, build the pool without SGLang's per-draft SSM snapshot buffer."""
    owner = self.__dict__.get(OWNER_ATTR)
    if owner is not None and owner != id(self):
        result = original(self, *args, **kwargs)
        setattr(self.mamba_pool, RING_ATTR, None)
        logger.info("sglang_replayssm: draft clone of a hybrid pool (clone_with_new_mamba): no ring")
        return result
    self.__dict__[OWNER_ATTR] = id(self)
    cfg = current()
    cache_params = _arg(args, kwargs, "cache_params", 2)
    window = None
    if cfg.enable:
        window = pool_spec_window(cfg, _opt_arg(args, kwargs, "speculative_num_draft_tokens", 6))
    if window is not None and plan_ring(cache_params, cfg) is not None:
        result = _build_pool_without_snapshots(original, self, cache_params, _arg(args, kwargs, "device", 4),
                                               args, kwargs)
    else:
        result = original(self, *args, **kwargs)
    ring = None
    if cfg.enable:
        ring = build_ring(self.mamba_pool, cache_params, _arg(args, kwargs, "mamba_layer_ids", 3), cfg,
                          window=window)
    setattr(self.mamba_pool, RING_ATTR, ring)
    if ring is not None:
        _RINGS[ring] = weakref.ref(self.mamba_pool)
    return result


_RINGS: "weakref.WeakKeyDictionary[ReplayRing, Any]" = weakref.WeakKeyDictionary()


def registered_rings():
    """``(ring, mamba_pool)`` of every live pool this process built a ring for (the seams that see
    only a ring's views, e.g. ``prefix_track``, find their pool here)."""
    out = []
    for ring, ref in list(_RINGS.items()):
        mamba_pool = ref()
        if mamba_pool is not None and getattr(mamba_pool, RING_ATTR, None) is ring:
            out.append((ring, mamba_pool))
    return out


def pool_spec_window(cfg: ReplaySSMConfig, num_draft_tokens: Optional[int]) -> Optional[int]:
    """Verify window of the pool being built: SGLang passes ``speculative_num_draft_tokens``
    only when the server speculates; an adaptive maximum in the published args widens it."""
    if not cfg.spec or not num_draft_tokens:
        return None
    server_args = published_config()[0]
    published = spec_window(server_args, cfg) if server_args is not None else None
    return max(int(num_draft_tokens), published or 0)


def handle_max_mamba_cache_around(original, self, *args, **kwargs):
    """AROUND SGLang's mamba pool solver: with a spec ring, solve as without speculative decoding.

    Stock reserves ``per_req * draft_tokens`` per request for the per-draft SSM snapshots
    (joint solve); the ring verifier allocates none (:func:`init_mamba_pool_around`), so the
    whole mamba budget goes to slots, whose size (``mamba_cache_per_req``, patched) includes
    the spec ring.  The solver reads speculation only through ``self.spec_algorithm``, which is
    seen as NONE for the duration of the call.  Then (0.5.17+, :func:`_auto_max_running`,
    :func:`_charge_draft_kv`): with ``spec_max_running=auto`` the max running requests are
    solved from memory instead of SGLang's flat speculative default, and the KV budget
    returned is shared with the draft model's KV pool."""
    cfg = current()
    algo = getattr(self, "spec_algorithm", None)
    config = getattr(self, "mambaish_config", None)
    params = getattr(config, "mamba2_cache_params", None)
    if not (cfg.enable and cfg.spec) or algo is None or algo.is_none() or params is None \
            or plan_ring(params, cfg) is None:
        return original(self, *args, **kwargs)
    bags = _config_bags(self)
    auto = cfg.spec_max_running == "auto" and bags is not None \
        and bags.get_schedule().max_mamba_cache_size is None
    sglang_default = bags.get_schedule().max_running_requests if auto else None
    if auto:  # let the solver fit the slot count to memory (its non-speculative branch)
        bags.get_context().override("sglang_replayssm.spec_max_running", max_running_requests=None)
    # KVCacheConfigurator is a slots dataclass (no __dict__): swap the attribute and restore it
    self.spec_algorithm = type(algo).NONE
    try:
        result = original(self, *args, **kwargs)
    except BaseException:
        if auto:
            bags.get_context().override("sglang_replayssm.spec_max_running", max_running_requests=sglang_default)
        raise
    finally:
        self.spec_algorithm = algo
    if auto:
        result += _auto_max_running(self, bags, params, sglang_default)
    windows_gb = conv_window_bytes(params, _resolved_sizes(self)) / (1 << 30)
    logger.info("sglang_replayssm: mamba pool sized without per-draft SSM snapshots (spec ring verifier); "
                "%.3f GiB reserved for SGLang's per-draft conv windows", windows_gb)
    result -= windows_gb
    return _charge_draft_kv(self, result) if bags is not None else result


def _solver_module(solver_self):
    """The module of SGLang's solver class: where it imports its runtime-config accessors."""
    import sys

    return sys.modules.get(type(solver_self).__module__)


def _config_bags(solver_self):
    """The solver module's runtime-config accessors (0.5.17+), or None (0.5.15 reads ServerArgs)."""
    mod = _solver_module(solver_self)
    if all(hasattr(mod, name) for name in ("get_schedule", "get_context", "get_exec")):
        return mod
    return None


def _graph_decode_max_bs(bags) -> int:
    try:
        graph = bags.get_exec().graph.cuda_graph_config
        return int(graph.decode.max_bs or 0) if graph is not None else 0
    except AttributeError:
        return 0


def _auto_max_running(solver_self, bags, params, sglang_default) -> float:
    """After the solver fitted ``K`` slots to the mamba budget (non-speculative branch):
    max running requests ``N = min(K / ratio, max(decode CUDA-graph batch, SGLang's
    default))``.  The cap keeps the batch within what SGLang's speculative workers
    preallocate for (``max(decode graph max_bs, max_running_requests)`` at their init, before
    this solve).  Without the radix cache (one slot per request) the pool shrinks to ``N``
    slots and the bytes of the unused ones go back to the KV budget (returned, in GiB)."""
    sched = bags.get_schedule()
    K = int(sched.max_mamba_cache_size)
    ratio = max(1, int(solver_self._calculate_mamba_ratio()))
    graph_bs = _graph_decode_max_bs(bags)
    cap = max(graph_bs, int(sglang_default or 0), 1)
    N = max(1, min(K // ratio, cap))
    give_back = 0.0
    fields = {"max_running_requests": N}
    if ratio == 1 and N < K:
        per_slot = int(params.mamba_cache_per_req)  # patched: state + conv + ring
        give_back = (K - N) * per_slot / (1 << 30)
        fields["max_mamba_cache_size"] = N
    bags.get_context().override("sglang_replayssm.spec_max_running", **fields)
    if N > int(sglang_default or 0):
        _widen_flashinfer_workspace(N * int(bags.get_spec().speculative_num_draft_tokens or 1))
    logger.info("sglang_replayssm: max running requests %d, solved from memory under the ring verifier "
                "(SGLang's speculative default: %s; memory fits %d slot(s), %d state slot(s) per request, "
                "decode CUDA-graph batch %d); %.2f GiB of unused slots returned to the KV pool",
                N, sglang_default, K, ratio, graph_bs, give_back)
    return give_back


FLASHINFER_WORKSPACE_ENV = "SGLANG_FLASHINFER_WORKSPACE_SIZE"
WORKSPACE_BYTES_PER_VERIFY_TOKEN = 768 << 10   # FlashInfer's split-KV prefill temporaries per query token
WORKSPACE_BASE_BYTES = 256 << 20


def _widen_flashinfer_workspace(verify_tokens: int) -> None:
    """Size FlashInfer's workspace for a target-verify batch of ``verify_tokens`` query tokens.

    SGLang's default (384 MiB, ``SGLANG_FLASHINFER_WORKSPACE_SIZE``) is sized for its own
    speculative batches (48 requests); on the H200, Nemotron-H-8B's verify at 256 requests x 4
    tokens needed 574 MiB for ``batch_prefill_tmp_v`` alone (about 0.56 MiB per query token)
    and CUDA-graph capture failed.  Runs in the scheduler process before the attention backend
    allocates the buffer; a value the user set is left alone."""
    import os

    if FLASHINFER_WORKSPACE_ENV in os.environ:
        return
    want = WORKSPACE_BASE_BYTES + verify_tokens * WORKSPACE_BYTES_PER_VERIFY_TOKEN
    try:
        from sglang.srt.environ import envs

        current = int(envs.SGLANG_FLASHINFER_WORKSPACE_SIZE.get())
    except (ImportError, AttributeError):
        current = 384 << 20
    if want > current:
        os.environ[FLASHINFER_WORKSPACE_ENV] = str(want)
        logger.info("sglang_replayssm: %s=%d MiB for target-verify batches of %d query tokens (SGLang's "
                    "default: %d MiB)", FLASHINFER_WORKSPACE_ENV, want >> 20, verify_tokens, current >> 20)


def _charge_draft_kv(solver_self, rest_gb: float) -> float:
    """Share the KV budget with the draft model's KV pool where SGLang does not.

    SGLang scales its per-token KV cost by the draft's layers only when the draft has its own
    checkpoint (``spec_aux_config.eagle_draft_num_layers``); a NEXTN/MTP draft inside the
    target checkpoint is not charged, and its pool (the same token count as the target's) then
    comes out of the activation slack.  Stock gets away with it because the snapshot reserve
    keeps its token count small; with the snapshots gone the target's pool grows and the
    draft's would no longer fit.  So the budget is scaled by ``n / (n + d)`` (``n`` target
    attention layers, ``d`` MTP layers): the target's and the draft's pools together fit it."""
    aux = getattr(solver_self, "spec_aux_config", None)
    if aux is None or getattr(aux, "eagle_draft_num_layers", None):
        return rest_gb  # SGLang charges the draft itself (or there is no EAGLE-family draft)
    algo = solver_self.spec_algorithm
    if not (getattr(algo, "is_eagle", lambda: False)() or getattr(algo, "is_standalone", lambda: False)()):
        return rest_gb
    hf = getattr(getattr(solver_self, "model_config", None), "hf_config", None)
    d = int(getattr(hf, "num_nextn_predict_layers", 0) or 0)
    n = len(getattr(solver_self.mambaish_config, "full_attention_layer_ids", None) or ())
    if d <= 0 or n <= 0 or rest_gb <= 0:
        return rest_gb
    charged = rest_gb * n / (n + d)
    logger.info("sglang_replayssm: KV budget %.2f GiB shared with the MTP draft's KV pool (%d target + %d draft "
                "attention layer(s)): %.2f GiB for the target's tokens", rest_gb, n, d, charged)
    return charged


def _resolved_sizes(solver_self):
    """(draft tokens, max running requests) as SGLang resolved them for the pool: its runtime
    config bags where the solver's module reads them (0.5.17+), else the server args (0.5.15)."""
    from types import SimpleNamespace

    mod = _solver_module(solver_self)
    sa = getattr(solver_self, "server_args", None)
    out = {}
    for name, bag in (("speculative_num_draft_tokens", "get_spec"), ("max_running_requests", "get_schedule"),
                      ("max_mamba_cache_size", "get_schedule")):
        val = None
        getter = getattr(mod, bag, None)
        if getter is not None:
            try:
                val = getattr(getter(), name, None)
            except Exception:  # a config bag not populated in this process
                val = None
        out[name] = val if val is not None else getattr(sa, name, None)
    return SimpleNamespace(**out)


def conv_window_bytes(params, server_args) -> int:
    """Bytes SGLang still allocates for its per-draft conv windows (conv rollback) beside a spec
    ring: one conv state per draft token per request slot (+1 padding slot), all layers -- what
    stock's solver charges for them (it budgets ``per_req * D * (reqs + 1)`` for conv and SSM
    snapshots together); the deduplicated window layout needs no more than that."""
    D = int(getattr(server_args, "speculative_num_draft_tokens", None) or 0)
    reqs = getattr(server_args, "max_running_requests", None) or getattr(server_args, "max_mamba_cache_size", None)
    if not D or not reqs:
        raise RingGeometryError("spec ring sizing: --speculative-num-draft-tokens and --max-running-requests must "
                                "be resolved before SGLang sizes the mamba pool")
    conv = sum(int(torch.Size(c).numel()) for c in params.shape.conv) * params.dtype.conv.itemsize
    return conv * len(params.layers) * D * (int(reqs) + 1)


def clear_slots_after(result, self, *args, **kwargs):
    """AFTER ``MambaPool.clear_slots``: empty the rings of the cleared slots (no sync)."""
    ring = getattr(self, RING_ATTR, None)
    if ring is not None:
        ring.reset_nosync(_arg(args, kwargs, "indices", 0))
    return None


def copy_from_after(result, self, *args, **kwargs):
    """AFTER ``MambaPool.copy_from``: the copy holds the checkpoint only, so ``write_pos[dst] = 0``."""
    ring = getattr(self, RING_ATTR, None)
    if ring is None:
        return None
    if getattr(self, "debug_memory_pool", False):
        src = torch.as_tensor(_arg(args, kwargs, "src_indices", 0)).reshape(-1).to(ring.device, torch.long)
        wp = ring.write_pos[src]
        if bool((wp != 0).any()):  # debug only: syncs
            raise UnflushedCopyError(
                f"MambaPool.copy_from from slot(s) {src.tolist()} with ring entries {wp.tolist()}: "
                "a ReplaySSM source must be flushed (write_pos == 0) before it is copied")
    ring.reset_nosync(_arg(args, kwargs, "dst_indices", 1))
    return None


def mamba_cache_per_req_after(value, self):
    """PROPERTY ``mamba_cache_per_req``: + ring bytes of one slot over all of ``self.layers``."""
    cfg = current()
    if not cfg.enable:
        return None
    plan = plan_ring(self, cfg)
    if plan is None:
        return None
    return value + ring_bytes_per_slot(plan.geom, spec_window(published_config()[0], cfg)) * len(self.layers)


PATCHES = [
    Patch(INIT_TARGET, "around", init_mamba_pool_around,
          params=("self", "mamba_size", "mamba_spec_state_size", "cache_params", "mamba_layer_ids", "device",
                  "enable_mamba_extra_buffer", "speculative_num_draft_tokens"),
          description="attach the ReplaySSM ring (mamba_pool.rssm_ring); spec ring: no per-draft SSM snapshots"),
    Patch(SOLVER_TARGET, "around", handle_max_mamba_cache_around, versions=">=0.5.17,<0.6", params=("self",),
          description="size the mamba pool without per-draft snapshots when the ring verifier serves spec"),
    Patch(SOLVER_TARGET_0515, "around", handle_max_mamba_cache_around, versions=">=0.5.15,<0.5.17",
          params=("self",),
          description="size the mamba pool without per-draft snapshots when the ring verifier serves spec"),
    Patch(CLEAR_TARGET, "after", clear_slots_after, params=("self", "indices"),
          description="reset the ring cursors of cleared slots"),
    Patch(COPY_TARGET, "after", copy_from_after, params=("self", "src_indices", "dst_indices"),
          description="reset the ring cursors of copy destinations (sources must be flushed)"),
    Patch(CHARGE_TARGET, "property_after", mamba_cache_per_req_after, params=("self",),
          description="charge ring bytes per request in SGLang's mamba pool sizing"),
]
