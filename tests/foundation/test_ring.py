"""The ring-state module: geometries, sizing, standard and spec rings, cursor reset and copy."""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.ring import (GDNRingGeometry, Mamba2RingGeometry, make_ring, ring_bytes_per_slot)


def test_standard_ring_shapes_and_bytes():
    geom = Mamba2RingGeometry(nheads=8, head_dim=16, dstate=32, ngroups=2, buffer_len=5)
    ring = make_ring("mamba2", 3, 4, nheads=8, head_dim=16, dstate=32, ngroups=2, buffer_len=5)
    assert ring.ring_len == 5 and ring.spec_cursors is None and ring.kind == "mamba2"
    assert ring.layer(1)["x"].shape == (4, 8, 5, 16) and ring.layer(1)["B"].shape == (4, 2, 5, 32)
    # x (bf16) + B (bf16) + dt (fp32)
    assert ring_bytes_per_slot(geom) == 8 * 5 * 16 * 2 + 2 * 5 * 32 * 2 + 8 * 5 * 4
    assert ring.nbytes() == 3 * 4 * ring_bytes_per_slot(geom) + 4 * 4


def test_spec_ring_is_B_plus_T_long_with_three_cursors():
    kw = dict(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8, buffer_len=6)
    geom = GDNRingGeometry(**kw)
    ring = make_ring("gdn", 2, 5, spec_window=3, **kw)
    assert ring.ring_len == 9 and ring.kind == "gdn"
    assert ring.layer(0)["d"].shape == (5, 4, 9, 8) and ring.layer(0)["k"].shape == (5, 2, 9, 16)
    assert ring_bytes_per_slot(geom, spec_window=3) == ring_bytes_per_slot(geom) * 9 // 6
    assert ring.nbytes() == 2 * 5 * ring_bytes_per_slot(geom, 3) + 3 * 5 * 4
    origin, flush = ring.spec_cursors
    ring.write_pos.copy_(torch.tensor([1, 2, 3, 4, 5], dtype=torch.int32))
    origin.copy_(torch.tensor([5, 6, 7, 8, 0], dtype=torch.int32))
    flush.copy_(torch.tensor([0, 1, 1, 1, 1], dtype=torch.int32))
    ring.tensors["g"][:, 1] = 7.0
    ring.copy_slots([1], [4])
    assert int(ring.write_pos[4]) == 2 and int(origin[4]) == 6 and int(flush[4]) == 1
    assert bool((ring.tensors["g"][:, 4] == 7.0).all())
    ring.reset([1, 3])
    ring.reset_nosync(torch.tensor([2]))
    assert ring.write_pos.tolist() == [1, 0, 0, 0, 2]
    assert origin.tolist() == [5, 0, 0, 0, 6] and flush.tolist() == [0, 0, 0, 0, 1]


def test_spec_window_longer_than_the_history_block_is_refused():
    with pytest.raises(ValueError, match="buffer length B=2 must be an int >= the verify window T=3"):
        make_ring("mamba2", 1, 2, spec_window=3, nheads=2, head_dim=4, dstate=4, ngroups=1, buffer_len=2)
    with pytest.raises(ValueError, match="window T"):
        make_ring("mamba2", 1, 2, spec_window=0, nheads=2, head_dim=4, dstate=4, ngroups=1, buffer_len=2)


def test_bad_geometry_and_kind():
    with pytest.raises(ValueError, match="multiple of ngroups"):
        Mamba2RingGeometry(nheads=6, head_dim=4, dstate=4, ngroups=4, buffer_len=2)
    with pytest.raises(ValueError, match="unknown ring kind"):
        make_ring("rwkv", 1, 1)
    ring = make_ring("mamba2", 1, 2, nheads=2, head_dim=4, dstate=4, ngroups=1, buffer_len=2)
    with pytest.raises(IndexError, match="slot ids"):
        ring.reset([2])


def test_verify_cursors_are_the_three_spec_cursors():
    kw = dict(nheads=2, head_dim=4, dstate=4, ngroups=1, buffer_len=2)
    assert make_ring("mamba2", 1, 3, **kw).verify_cursors is None
    ring = make_ring("mamba2", 1, 3, spec_window=2, **kw)
    wp, origin, flush = ring.verify_cursors
    assert wp is ring.write_pos and (origin, flush) == ring.spec_cursors
