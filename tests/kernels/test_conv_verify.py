"""conv1d_verify (kernels/conv_verify.py): the chain-verify causal conv1d with SGLang's side effects.

Against the fp64 oracle (the plain causal convolution of the committed inputs then the window), the fp32
PyTorch reference (same side effects, bit for bit on the copies), and SGLang's own ``causal_conv1d_update`` (its
state and window writes everywhere; its outputs on CUDA only: in Triton's CPU interpreter that kernel's outputs
are wrong, its running sum aliasing its bias across tokens).  Poisoned outputs and windows, padded rows, odd
channel counts over partial blocks, both window layouts, transposed and contiguous inputs.
"""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.kernels.conv_verify import conv1d_verify, window_is_deduplicated
from sglang_replayssm.kernels.conv_verify_ref import conv1d_chain_oracle, conv1d_verify_ref

from kernel_testlib import bits, make_gen, mismatch

DEV = "cuda" if torch.cuda.is_available() else "cpu"
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
# bf16 outputs, kernel vs the fp32 reference: two units in the last place (one for fp32 exp / summation noise at
# a rounding boundary, one because Triton's CPU interpreter truncates fp32 -> bf16 where torch rounds)
REF_RTOL = 2 ** -6
SMALL = {"BLOCK_F": 16, "num_warps": 1}  # several programs a row and a partial last block at odd dims


def _window(rows, T, dim, K, dtype, dedup, poison=float("nan")):
    """(physical buffer, the [rows, T, dim, K-1] view SGLang hands the kernel): CUDA's deduplicated layout
    (step t, column c at physical column t + c) or the dense one."""
    if dedup:
        phys = torch.full((rows, dim, T + K - 2), poison, dtype=dtype, device=DEV)
        s = phys.stride()
        return phys, phys.as_strided((rows, T, dim, K - 1), (s[0], s[2], s[1], s[2]))
    phys = torch.full((rows, T, dim, K - 1), poison, dtype=dtype, device=DEV)
    return phys, phys


def _case(gen, batch, dim, T, K, n_slots, xdt=BF16, sdt=BF16, wdt=BF16, transposed=True, pad=(), bias=True):
    def rnd(*shape, dtype):
        return torch.randn(*shape, generator=gen).to(dtype).to(DEV)

    if transposed:  # SGLang's verify: tokens [batch*T, dim] viewed as [batch, dim, T]
        x = rnd(batch * T, dim, dtype=xdt).view(batch, T, dim).transpose(1, 2)
    else:
        x = rnd(batch, dim, T, dtype=xdt)
    state = rnd(n_slots, dim, K - 1, dtype=sdt)
    w = (rnd(dim, K, dtype=F32) / K ** 0.5).to(wdt)
    b = rnd(dim, dtype=wdt) if bias else None
    slots = torch.randperm(n_slots - 1, generator=gen)[:batch].to(torch.int32) + 1
    for i in pad:
        slots[i] = -1
    rows = torch.randperm(batch + 1, generator=gen)[:batch].to(torch.int32)
    return x, state, w, b, slots.to(DEV), rows.to(DEV)


def _run(fn, x, state, w, b, act, slots, rows, win_rows, T, dim, K, wdt, dedup, launch=None, with_window=True):
    st = state.clone()
    phys, win = _window(win_rows, T, dim, K, wdt, dedup) if with_window else (None, None)
    kw = {"launch": launch} if launch is not None else {}
    if fn in (conv1d_verify, conv1d_verify_ref):  # poisoned outputs (SGLang's returns a new empty_like(x))
        kw["out"] = torch.full_like(x, float("nan"))
    res = fn(x, st, w, b, act, conv_state_indices=slots, intermediate_conv_window=win,
             intermediate_state_indices=rows if with_window else None, **kw)
    assert "out" not in kw or res.data_ptr() == kw["out"].data_ptr()
    return res, st, phys


def _check_against_oracle(out, x, state, w, b, act, slots, pad):
    for i in range(x.shape[0]):
        if i in pad:
            assert torch.isnan(out[i].float()).all(), f"padded row {i} was written"
            continue
        ref = conv1d_chain_oracle(state[int(slots[i])].cpu(), x[i].cpu(), w.cpu(), None if b is None else b.cpu(),
                                  silu=act is not None)
        # fp32 products and sum, one conversion to the output dtype: within one unit in its last place (the GPU
        # rounds to nearest, Triton's CPU interpreter truncates)
        eps = {BF16: 2 ** -7, F16: 2 ** -10, F32: 2 ** -22}[out.dtype]
        worst, at = mismatch(out[i].cpu(), ref, rtol=eps, atol=1e-5)
        assert worst <= 1.0, f"row {i}: {worst:.2f}x the tolerance at {at}"


@pytest.mark.parametrize("T,K", [(4, 4), (1, 4), (2, 4), (5, 4), (3, 3), (4, 2)])
@pytest.mark.parametrize("dedup", [True, False])
def test_against_reference_oracle_and_sglang_copies(T, K, dedup):
    gen, seed = make_gen()
    batch, n_slots = 5, 9
    dim = 40 if T % 2 else 32  # a partial last block of channels, or none
    pad = (1,)
    x, state, w, b, slots, rows = _case(gen, batch, dim, T, K, n_slots, pad=pad)
    args = (x, state, w, b, "silu", slots, rows, batch + 1, T, dim, K, BF16, dedup)
    out, st, phys = _run(conv1d_verify, *args, launch=SMALL)
    out_r, st_r, phys_r = _run(conv1d_verify_ref, *args)
    # copies are exact: the new conv states and the windows bit for bit (NaN poison where nothing is written)
    assert torch.equal(bits(st), bits(st_r)), f"seed {seed}: conv state"
    assert torch.equal(bits(phys), bits(phys_r)), f"seed {seed}: windows"
    live = [i for i in range(batch) if i not in pad]
    worst, _ = mismatch(out[live].cpu(), out_r[live].cpu(), rtol=REF_RTOL, atol=1e-6)
    assert worst <= 1.0, f"seed {seed}: outputs vs the reference"
    _check_against_oracle(out, x, state, w, b, "silu", slots, pad)
    # what stock writes: SGLang's own kernel on the same inputs (its outputs only on CUDA, see the docstring)
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

    out_s, st_s, phys_s = _run(causal_conv1d_update, *args)
    assert torch.equal(bits(st), bits(st_s)), f"seed {seed}: conv state vs SGLang"
    assert torch.equal(bits(phys), bits(phys_s)), f"seed {seed}: windows vs SGLang"
    if DEV == "cuda":  # SGLang rounds each product to bf16 before summing: a few bf16 ulps apart
        worst, _ = mismatch(out[live].float(), out_s[live].float(), rtol=2 ** -5, atol=2 ** -5)
        assert worst <= 1.0, f"seed {seed}: outputs vs SGLang"


def test_windows_new_state_by_hand():
    """K = 4, T = 4: the documented layout with integer inputs (exact in bf16)."""
    dim, T, K = 3, 4, 4
    state = torch.tensor([[[1., 2., 3.]] * dim], dtype=BF16, device=DEV)  # one slot: in(-3..-1) = 1, 2, 3
    x = torch.tensor([[[10., 11., 12., 13.]] * dim], dtype=BF16, device=DEV)  # in(0..3)
    w = torch.zeros(dim, K, dtype=BF16, device=DEV)
    w[:, K - 1] = 1.0  # out = in(t)
    phys, win = _window(1, T, dim, K, BF16, dedup=True)
    out = conv1d_verify(x, state, w, None, None, conv_state_indices=torch.zeros(1, dtype=torch.int32, device=DEV),
                        intermediate_conv_window=win, intermediate_state_indices=None)
    assert out[0, 0].tolist() == [10., 11., 12., 13.]
    assert phys[0, 0].tolist() == [2., 3., 10., 11., 12., 13.]
    assert win[0, :, 0].tolist() == [[2., 3., 10.], [3., 10., 11.], [10., 11., 12.], [11., 12., 13.]]
    assert state[0, 0].tolist() == [11., 12., 13.]


@pytest.mark.parametrize("sdt,xdt,wdt", [(F32, BF16, BF16), (F16, F16, F16), (F32, F32, F32)])
def test_dtypes_contiguous_inputs_no_bias_no_activation(sdt, xdt, wdt):
    gen, seed = make_gen()
    batch, dim, T, K, n_slots = 3, 33, 4, 4, 5
    x, state, w, b, slots, rows = _case(gen, batch, dim, T, K, n_slots, xdt=xdt, sdt=sdt, wdt=wdt,
                                        transposed=False, bias=False)
    args = (x, state, w, b, None, slots, rows, batch + 1, T, dim, K, sdt, True)
    out, st, phys = _run(conv1d_verify, *args, launch=SMALL)
    out_r, st_r, phys_r = _run(conv1d_verify_ref, *args)
    assert torch.equal(bits(st), bits(st_r)) and torch.equal(bits(phys), bits(phys_r)), f"seed {seed}"
    _check_against_oracle(out, x, state, w, b, None, slots, ())


def test_no_window_no_slot_indices_and_one_token_2d():
    gen, seed = make_gen()
    batch, dim, K = 4, 24, 4
    x, state, w, b, _, _ = _case(gen, batch, dim, 1, K, batch, transposed=False)
    x2 = x[:, :, 0]
    st, st_r = state.clone(), state.clone()
    out = conv1d_verify(x2, st, w, b, True, launch=SMALL)
    out_r = conv1d_verify_ref(x2, st_r, w, b, True)
    assert out.shape == x2.shape
    assert torch.equal(bits(st), bits(st_r)), f"seed {seed}"
    worst, _ = mismatch(out.cpu(), out_r.cpu(), rtol=REF_RTOL, atol=1e-6)
    assert worst <= 1.0, f"seed {seed}"


def test_out_of_range_window_rows_and_slots_write_nothing():
    gen, seed = make_gen()
    batch, dim, T, K, n_slots = 3, 16, 4, 4, 4
    x, state, w, b, slots, _ = _case(gen, batch, dim, T, K, n_slots)
    slots[2] = n_slots  # past the state: skipped, not an out-of-bounds write
    rows = torch.tensor([0, 7, 1], dtype=torch.int32, device=DEV)  # row 1's window row is out of range
    out, st, phys = _run(conv1d_verify, x, state, w, b, "silu", slots, rows, 2, T, dim, K, BF16, True,
                         launch=SMALL)
    assert torch.isnan(out[2].float()).all()
    assert torch.isfinite(out[:2].float()).all()
    assert torch.isfinite(phys[0].float()).all() and torch.isnan(phys[1].float()).all()
    changed = (bits(st) != bits(state)).flatten(1).any(1).tolist()
    assert changed == [i in (int(slots[0]), int(slots[1])) for i in range(n_slots)]


def test_window_layout_detection():
    _, dedup = _window(2, 4, 8, 4, BF16, True)
    _, dense = _window(2, 4, 8, 4, BF16, False)
    assert window_is_deduplicated(dedup) and not window_is_deduplicated(dense)


@pytest.mark.parametrize("bad", ["x3", "weight", "state", "window", "slots", "activation"])
def test_bad_arguments_raise(bad):
    gen, _ = make_gen()
    x, state, w, b, slots, rows = _case(gen, 2, 8, 4, 4, 3)
    _, win = _window(3, 4, 8, 4, BF16, True)
    kw = dict(conv_state_indices=slots, intermediate_conv_window=win, intermediate_state_indices=rows)
    act = "silu"
    if bad == "x3":
        x = x[..., None]
    elif bad == "weight":
        w = w[:4]
    elif bad == "state":
        state = state[:, :, :2]
    elif bad == "window":
        kw["intermediate_conv_window"] = win[:, :, :4]
    elif bad == "slots":
        kw["conv_state_indices"] = slots.float()
    else:
        act = "gelu"
    with pytest.raises(ValueError, match="conv1d_verify"):
        conv1d_verify(x, state, w, b, act, **kw)


def test_transposed_layout_against_sglang_and_reference():
    """A conv state [slots, K-1, dim] handed over transposed (channels contiguous, as SGLang's kernel accepts) and a
    deduplicated window buffer [rows, T+K-2, dim]: the compile-time row strides do not apply (the tensors' own
    strides do), the results are the same."""
    gen, seed = make_gen()
    batch, dim, T, K, n_slots = 3, 40, 4, 4, 5  # dim 40: a partial last block of 16 channels
    x, _, w, b, slots, rows = _case(gen, batch, dim, T, K, n_slots)
    state = torch.randn(n_slots, K - 1, dim, generator=gen).to(BF16).to(DEV).transpose(1, 2)
    res = {}
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

    for name, fn in (("ours", conv1d_verify), ("ref", conv1d_verify_ref), ("sglang", causal_conv1d_update)):
        st = state.clone(memory_format=torch.preserve_format)
        assert st.stride() == state.stride()
        phys = torch.full((batch + 1, T + K - 2, dim), float("nan"), dtype=BF16, device=DEV)
        s = phys.stride()
        win = phys.as_strided((batch + 1, T, dim, K - 1), (s[0], s[1], s[2], s[1]))
        kw = {"launch": SMALL} if fn is conv1d_verify else {}
        out = fn(x, st, w, b, "silu", conv_state_indices=slots, intermediate_conv_window=win,
                 intermediate_state_indices=rows, **kw)
        res[name] = (out, st, phys)
    for other in ("ref", "sglang"):
        assert torch.equal(bits(res["ours"][1]), bits(res[other][1])), f"seed {seed}: conv state vs {other}"
        assert torch.equal(bits(res["ours"][2]), bits(res[other][2])), f"seed {seed}: windows vs {other}"
    worst, _ = mismatch(res["ours"][0].cpu(), res["ref"][0].cpu(), rtol=REF_RTOL, atol=1e-6)
    assert worst <= 1.0, f"seed {seed}: outputs vs the reference"


def _sglang_update():
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

    return causal_conv1d_update


@pytest.mark.parametrize("case", ["fp32_inputs_bf16_copies", "wider_state", "strided_indices"])
def test_copies_bit_for_bit_with_sglang(case):
    """The copies SGLang's kernel also makes, bit for bit: fp32 inputs stored into a bf16 state and window (the
    stores round), a conv state wider than K-1 columns (only the first K-1 are the committed inputs: the generic
    store path), index tensors that are strided views (read by row, as SGLang reads them)."""
    gen, seed = make_gen()
    batch, dim, T, K, n_slots = 3, 40, 4, 4, 7
    xdt = F32 if case == "fp32_inputs_bf16_copies" else BF16
    x, state, w, b, slots, rows = _case(gen, batch, dim, T, K, n_slots, xdt=xdt)
    if case == "wider_state":
        state = torch.cat([state, torch.randn(n_slots, dim, 2, generator=gen).to(BF16).to(DEV)], 2)
    if case == "strided_indices":
        slots = torch.stack([slots, torch.full_like(slots, n_slots - 1)], 1)[:, 0]
        rows = torch.stack([rows, torch.zeros_like(rows)], 1)[:, 0]
        assert slots.stride() == (2,) and rows.stride() == (2,)
    res = {}
    for name, fn in (("ours", conv1d_verify), ("sglang", _sglang_update())):
        kw = {"launch": SMALL} if fn is conv1d_verify else {}
        st = state.clone()
        phys, win = _window(batch + 1, T, dim, K, BF16, dedup=True)
        out = fn(x, st, w, b, "silu", conv_state_indices=slots, intermediate_conv_window=win,
                 intermediate_state_indices=rows, **kw)
        res[name] = (out, st, phys)
    assert torch.equal(bits(res["ours"][1]), bits(res["sglang"][1])), f"seed {seed}: conv state"
    assert torch.equal(bits(res["ours"][2]), bits(res["sglang"][2])), f"seed {seed}: windows"
    _check_against_oracle(res["ours"][0], x, state, w, b, "silu", slots, ())


def test_index_tensors_longer_than_the_batch_read_their_first_entries():
    gen, seed = make_gen()
    batch, dim, T, K, n_slots = 2, 16, 4, 4, 6
    x, state, w, b, slots, rows = _case(gen, batch, dim, T, K, n_slots)
    long_slots = torch.cat([slots, torch.tensor([n_slots - 1], dtype=slots.dtype, device=DEV)])
    long_rows = torch.cat([rows, torch.tensor([batch], dtype=rows.dtype, device=DEV)])
    a = _run(conv1d_verify, x, state, w, b, "silu", long_slots, long_rows, batch + 1, T, dim, K, BF16, True,
             launch=SMALL)
    r = _run(conv1d_verify, x, state, w, b, "silu", slots, rows, batch + 1, T, dim, K, BF16, True, launch=SMALL)
    for u, v in zip(a, r):
        assert torch.equal(bits(u), bits(v)), f"seed {seed}"


def test_out_sharing_memory_with_an_input_is_refused():
    gen, _ = make_gen()
    x, state, w, b, slots, rows = _case(gen, 2, 8, 4, 4, 3)
    with pytest.raises(ValueError, match="shares memory"):
        conv1d_verify(x, state, w, b, "silu", conv_state_indices=slots, out=x)
