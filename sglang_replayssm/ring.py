"""Ring state: the one owner of ReplaySSM ring tensors and cursors per mamba slot.

A ring holds, per (layer, slot), the SSM *inputs* of the last ``< L`` decoded tokens
so that the output can be replayed from the checkpoint state.  Layouts (per slot,
slot axis first so that a ring is indexed exactly like SGLang's ``MambaPool``):

Mamba2 (``Mamba2RingGeometry``)
    x   [H, L, P]  activation dtype   post-conv x_j (exact kernel input)
    B   [G, L, N]  activation dtype   post-conv B_j (shared by the heads of a group)
    dt  [H, L]     fp32               processed Δ_j = softplus(dt_j + dt_bias)

Gated DeltaNet (``GDNRingGeometry``)
    d   [HV, L, V] state dtype        d_j = β_j (v_j − α_j S_{j−1} k̂_j)
    k   [Hk, L, K] activation dtype   raw (pre-L2-norm) k_j, re-normalised on read
    g   [HV, L]    fp32               log-decay g_j

Cursor: ``write_pos[slot]`` (int32) = number of valid ring entries; the linear AR ring
is always read from position 0, so a recycled slot needs no zeroing, only
``write_pos = 0``.  Slot 0 is SGLang's dummy slot and is never written by a kernel.

Spec ring (``spec_window=T``, speculative verify): the same tensors with ring length
``R = L + T`` (``L`` the history block), used circularly, plus two more per-slot int32
cursors, ``origin`` and ``flush`` (``kernels/spec_cursor.py`` has the rules; a
standard decode step on such a ring is a verify of T = 1 committing one token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Tuple

import torch

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def as_dtype(d) -> torch.dtype:
    if isinstance(d, torch.dtype):
        return d
    try:
        return _DTYPES[str(d)]
    except KeyError:
        raise ValueError(f"unsupported dtype {d!r}; accepted: {sorted(_DTYPES)}") from None


def _check_positive(**kw) -> None:
    for k, v in kw.items():
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"ring geometry: {k} must be a positive int, got {v!r}")


@dataclass(frozen=True)
class Mamba2RingGeometry:
    nheads: int
    head_dim: int
    dstate: int
    ngroups: int
    buffer_len: int
    act_dtype: torch.dtype = torch.bfloat16

    def __post_init__(self):
        _check_positive(nheads=self.nheads, head_dim=self.head_dim, dstate=self.dstate,
                        ngroups=self.ngroups, buffer_len=self.buffer_len)
        if self.nheads % self.ngroups:
            raise ValueError(f"nheads ({self.nheads}) must be a multiple of ngroups ({self.ngroups})")

    def shapes(self, ring_len: Optional[int] = None) -> Dict[str, Tuple[Tuple[int, ...], torch.dtype]]:
        H, P, N, G = self.nheads, self.head_dim, self.dstate, self.ngroups
        L = ring_len or self.buffer_len
        return {
            "x": ((H, L, P), self.act_dtype),
            "B": ((G, L, N), self.act_dtype),
            "dt": ((H, L), torch.float32),
        }


@dataclass(frozen=True)
class GDNRingGeometry:
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    buffer_len: int
    act_dtype: torch.dtype = torch.bfloat16
    state_dtype: torch.dtype = torch.float32

    def __post_init__(self):
        _check_positive(num_k_heads=self.num_k_heads, num_v_heads=self.num_v_heads,
                        head_k_dim=self.head_k_dim, head_v_dim=self.head_v_dim,
                        buffer_len=self.buffer_len)
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"num_v_heads ({self.num_v_heads}) must be a multiple of num_k_heads ({self.num_k_heads})")

    def shapes(self, ring_len: Optional[int] = None) -> Dict[str, Tuple[Tuple[int, ...], torch.dtype]]:
        Hk, HV, K, V = self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        L = ring_len or self.buffer_len
        return {
            "d": ((HV, L, V), self.state_dtype),
            "k": ((Hk, L, K), self.act_dtype),
            "g": ((HV, L), torch.float32),
        }


def ring_bytes_per_slot(geom, spec_window: Optional[int] = None) -> int:
    """Bytes of ring storage one slot of one layer needs (a spec ring: ``spec_window`` = T)."""
    total = 0
    for shape, dtype in geom.shapes(_ring_len(geom, spec_window)).values():
        n = 1
        for s in shape:
            n *= s
        total += n * torch.empty((), dtype=dtype).element_size()
    return total


def _ring_len(geom, spec_window: Optional[int]) -> int:
    if spec_window is None:
        return geom.buffer_len
    from .kernels.spec_cursor import spec_ring_len

    return spec_ring_len(geom.buffer_len, spec_window)


class ReplayRing:
    """Ring tensors for ``num_layers`` layers x ``num_slots`` slots, plus the slot cursors.

    ``tensors[name]`` has shape ``[num_layers, num_slots, *per_slot_shape]``;
    ``layer(i)`` returns per-layer views ``[num_slots, *per_slot_shape]`` (strided
    views are what the kernels receive, so they must honour ``stride(0)``).
    """

    def __init__(self, geom, num_layers: int, num_slots: int, device="cpu", spec_window: Optional[int] = None):
        _check_positive(num_layers=num_layers, num_slots=num_slots)
        self.geom = geom
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.device = torch.device(device)
        self.spec_window = spec_window
        self.ring_len = _ring_len(geom, spec_window)
        self.tensors: Dict[str, torch.Tensor] = {
            name: torch.zeros((num_layers, num_slots) + shape, dtype=dtype, device=self.device)
            for name, (shape, dtype) in geom.shapes(self.ring_len).items()
        }
        self.write_pos = torch.zeros(num_slots, dtype=torch.int32, device=self.device)
        self.origin: Optional[torch.Tensor] = None
        self.flush: Optional[torch.Tensor] = None
        if spec_window is not None:
            self.origin = torch.zeros(num_slots, dtype=torch.int32, device=self.device)
            self.flush = torch.zeros(num_slots, dtype=torch.int32, device=self.device)

    @property
    def buffer_len(self) -> int:
        return self.geom.buffer_len

    @property
    def spec_cursors(self) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """``(origin, flush)`` of a spec ring, None for a standard-decode ring."""
        return None if self.origin is None else (self.origin, self.flush)

    @property
    def verify_cursors(self) -> Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """``(write_pos, origin, flush)`` as the verify and commit kernels take them; None for a
        standard-decode ring."""
        return None if self.origin is None else (self.write_pos, self.origin, self.flush)

    def _cursors(self):
        return [self.write_pos] + list(self.spec_cursors or ())

    @property
    def kind(self) -> str:
        """``"mamba2"`` or ``"gdn"``, from the geometry."""
        return "mamba2" if isinstance(self.geom, Mamba2RingGeometry) else "gdn"

    def layer(self, i: int) -> Dict[str, torch.Tensor]:
        if not 0 <= i < self.num_layers:
            raise IndexError(f"ring layer {i} out of range [0, {self.num_layers})")
        return {name: t[i] for name, t in self.tensors.items()}

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values()) + \
            sum(c.numel() * c.element_size() for c in self._cursors())

    def reset(self, slots: Iterable[int] | torch.Tensor) -> None:
        """Empty the rings of ``slots`` (cursor to 0; stale entries are masked, not zeroed)."""
        idx = torch.as_tensor(slots, dtype=torch.long, device=self.device).reshape(-1)
        if idx.numel() == 0:
            return
        if int(idx.min()) < 0 or int(idx.max()) >= self.num_slots:
            raise IndexError(f"ring reset: slot ids must be in [0, {self.num_slots}), got {idx.tolist()}")
        for c in self._cursors():  # a spec ring: origin 0 and flush 0 too (B >= T)
            c.index_fill_(0, idx, 0)

    def reset_nosync(self, slots) -> None:
        """:meth:`reset` without the bounds check, so without a host sync.

        Safe on the forward stream and inside CUDA-graph capture: a device index
        tensor stays on the device (dtype/device conversion is a device op) and the
        fill is one ``index_fill_``.  An out-of-range id is a device-side indexing
        error, exactly as in SGLang's own ``MambaPool.clear_slots``.
        """
        if isinstance(slots, torch.Tensor):
            idx = slots.reshape(-1).to(device=self.device, dtype=torch.long, non_blocking=True)
        else:
            idx = torch.as_tensor(slots, dtype=torch.long, device=self.device).reshape(-1)
        if idx.numel():
            for c in self._cursors():
                c.index_fill_(0, idx, 0)

    def copy_slots(self, src, dst) -> None:
        """Copy ring contents and cursors of ``src`` slots into ``dst`` slots (all layers)."""
        s = torch.as_tensor(src, dtype=torch.long, device=self.device).reshape(-1)
        d = torch.as_tensor(dst, dtype=torch.long, device=self.device).reshape(-1)
        if s.shape != d.shape:
            raise ValueError(f"copy_slots: src and dst differ in length ({s.numel()} vs {d.numel()})")
        for t in self.tensors.values():
            t[:, d] = t[:, s]
        for c in self._cursors():
            c[d] = c[s]


def make_ring(kind: str, num_layers: int, num_slots: int, device="cpu", spec_window: Optional[int] = None,
              **geom_kw) -> ReplayRing:
    """Convenience: ``make_ring("mamba2", 2, 9, nheads=8, ...)`` or ``make_ring("gdn", ...)``."""
    if kind == "mamba2":
        geom = Mamba2RingGeometry(**geom_kw)
    elif kind == "gdn":
        geom = GDNRingGeometry(**geom_kw)
    else:
        raise ValueError(f"unknown ring kind {kind!r}; accepted: 'mamba2', 'gdn'")
    return ReplayRing(geom, num_layers, num_slots, device, spec_window=spec_window)
