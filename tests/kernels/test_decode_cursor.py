"""kernels/decode_cursor.py: the decode cursor gather/advance kernels against their PyTorch references
(on CUDA when present, else TRITON_INTERPRET=1 on CPU), with padded and dummy rows, strided slot views and
wrap-around; on CUDA also captured in a CUDA graph and replayed."""
import random

import pytest
import torch

from sglang_replayssm.kernels.decode_cursor import (advance_cursors, advance_cursors_ref, gather_cursors,
                                                    gather_cursors_ref)


def _case(rnd, dtype):
    S, L = rnd.randint(4, 40), rnd.choice([1, 2, 4, 16])
    n = rnd.randint(1, S - 1)
    live = rnd.sample(range(1, S), n)  # distinct live slots; slot 0 is the dummy
    slots = [s if rnd.random() > 0.25 else rnd.choice([-1, 0]) for s in live]
    # cursors in [0, L-1] plus out-of-range values the kernels clamp
    wp = torch.tensor([rnd.randint(-2, L + 2) for _ in range(S)], dtype=dtype)
    return wp, torch.tensor(slots, dtype=rnd.choice([torch.int32, torch.int64])), L


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_gather_and_advance_match_the_reference(device, dtype):
    rnd = random.Random()
    for _ in range(6):
        wp, slots, L = _case(rnd, dtype)
        ref_wp = wp.clone()
        wp, dslots = wp.to(device), slots.to(device)
        rows = gather_cursors(wp, dslots)
        assert rows.dtype == wp.dtype and torch.equal(rows.cpu(), gather_cursors_ref(ref_wp, slots))
        advance_cursors(wp, dslots, rows, L)
        advance_cursors_ref(ref_wp, slots, gather_cursors_ref(ref_wp, slots), L)
        wp = wp.cpu()
        assert torch.equal(wp, ref_wp), (slots.tolist(), L)
        # every live slot moved by the rule; dummy and padded rows stored nothing
        assert all(0 <= int(wp[s]) < L for s in slots.tolist() if s > 0)


def test_advance_wraps_and_leaves_other_slots_alone(device):
    wp = torch.tensor([7, 15, 3, 14, 99, 6], dtype=torch.int32, device=device)
    before = wp.clone()
    slots = torch.tensor([[1, 9], [0, 9], [3, 9], [-1, 9], [4, 9]], dtype=torch.int32, device=device)[:, 0]
    assert slots.stride(0) == 2  # a strided view
    rows = gather_cursors(wp, slots)
    assert rows.tolist() == [15, 7, 14, 7, 99]
    advance_cursors(wp, slots, rows, 16)
    # 15 -> 0 (flush step wraps), 14 -> 15, 99 clamps to 15 -> 0; slots 0, 2, 5 untouched
    assert wp.tolist() == [7, 0, 3, 15, 0, 6] and wp[[0, 2, 5]].tolist() == before[[0, 2, 5]].tolist()


@pytest.mark.gpu
def test_captured_in_a_cuda_graph_the_cursors_move_on_every_replay():
    """Gather at the first layer, advance after the last, captured once: every replay moves each live
    row's cursor by one step of the ring (wrapping at L-1), as the decode seams rely on."""
    L, dev = 4, torch.device("cuda")
    wp = torch.tensor([0, 2, 3, 0, 1], dtype=torch.int32, device=dev)
    slots = torch.tensor([1, 2, -1, 4, 0], dtype=torch.int32, device=dev)
    advance_cursors(wp, slots, gather_cursors(wp, slots), L)  # compile outside the capture
    wp.copy_(torch.tensor([0, 2, 3, 0, 1], dtype=torch.int32))
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        rows = gather_cursors(wp, slots)
        advance_cursors(wp, slots, rows, L)
    want = [0, 2, 3, 0, 1]
    for _ in range(2 * L + 1):
        g.replay()
        for s in (1, 2, 4):
            want[s] = (want[s] + 1) % L
        assert wp.tolist() == want and rows.tolist()[:2] == [(want[1] - 1) % L, (want[2] - 1) % L]


def test_bad_input_is_refused_with_the_argument_named(device):
    wp = torch.zeros(8, dtype=torch.int32, device=device)
    slots = torch.tensor([1, 2], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="write_pos must be int32 or int64"):
        gather_cursors(wp.float(), slots)
    with pytest.raises(ValueError, match="write_pos must be contiguous"):
        gather_cursors(torch.zeros(8, 2, dtype=torch.int32, device=device)[:, 0], slots)
    with pytest.raises(ValueError, match="rows must be contiguous with the shape of slots"):
        advance_cursors(wp, slots, torch.zeros(3, dtype=torch.int32, device=device), 4)
    with pytest.raises(ValueError, match="slots is on cpu but write_pos is on meta"):
        gather_cursors(torch.zeros(8, dtype=torch.int32, device="meta"), slots.cpu())
    with pytest.raises(ValueError, match="buffer_len must be an int >= 1"):
        advance_cursors(wp, slots, gather_cursors(wp, slots), 0)
    assert gather_cursors(wp, slots[:0]).shape == (0,)  # an empty batch launches nothing
