"""kernels/decode_cursor.py: the decode cursor gather/advance kernels against their PyTorch references
(TRITON_INTERPRET=1 on CPU), with padded and dummy rows, strided slot views and wrap-around."""
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
def test_gather_and_advance_match_the_reference(dtype):
    rnd = random.Random()
    for _ in range(6):
        wp, slots, L = _case(rnd, dtype)
        ref_wp = wp.clone()
        rows = gather_cursors(wp, slots)
        assert rows.dtype == wp.dtype and torch.equal(rows, gather_cursors_ref(ref_wp, slots))
        advance_cursors(wp, slots, rows, L)
        advance_cursors_ref(ref_wp, slots, gather_cursors_ref(ref_wp, slots), L)
        assert torch.equal(wp, ref_wp), (slots.tolist(), L)
        # every live slot moved by the rule; dummy and padded rows stored nothing
        assert all(0 <= int(wp[s]) < L for s in slots.tolist() if s > 0)


def test_advance_wraps_and_leaves_other_slots_alone():
    wp = torch.tensor([7, 15, 3, 14, 99, 6], dtype=torch.int32)
    before = wp.clone()
    slots = torch.tensor([[1, 9], [0, 9], [3, 9], [-1, 9], [4, 9]], dtype=torch.int32)[:, 0]  # a strided view
    assert slots.stride(0) == 2
    rows = gather_cursors(wp, slots)
    assert rows.tolist() == [15, 7, 14, 7, 99]
    advance_cursors(wp, slots, rows, 16)
    # 15 -> 0 (flush step wraps), 14 -> 15, 99 clamps to 15 -> 0; slots 0, 2, 5 untouched
    assert wp.tolist() == [7, 0, 3, 15, 0, 6] and wp[[0, 2, 5]].tolist() == before[[0, 2, 5]].tolist()


def test_bad_input_is_refused_with_the_argument_named():
    wp = torch.zeros(8, dtype=torch.int32)
    slots = torch.tensor([1, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="write_pos must be int32 or int64"):
        gather_cursors(wp.float(), slots)
    with pytest.raises(ValueError, match="write_pos must be contiguous"):
        gather_cursors(torch.zeros(8, 2, dtype=torch.int32)[:, 0], slots)
    with pytest.raises(ValueError, match="rows must be contiguous with the shape of slots"):
        advance_cursors(wp, slots, torch.zeros(3, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="buffer_len must be an int >= 1"):
        advance_cursors(wp, slots, gather_cursors(wp, slots), 0)
    assert gather_cursors(wp, slots[:0]).shape == (0,)  # an empty batch launches nothing
