"""Every tensor-core (``tl.dot``) path, compiled, at odd head counts and dims, against the fp64 recurrence.

Triton's CPU interpreter ignores ``input_precision`` (its dots are plain fp32), so the other kernel tests
cannot tell tf32x3 from tf32 or a mis-tiled dot at a partial tile. These run only on CUDA
(eval/gpu_kernels.sh on the H200) and skip elsewhere. Paths: the Mamba2 decode flush rebuild
(``_rebuild_chunk``, unrolled and runtime chunk loop), the Mamba2 verify flush fold and ``nonflush: mma``, the GDN
decode flush ``flush: dot`` on the whole tile and on the K-chunked tile (``BKC``), the GDN verify ``flush: dot``
fold, the looping kernel's window dots (``window_dot``) and fold, and both materialize folds;
the Triton dots at ``dot_precision`` tf32x3 (the default) and ieee, the kernels' own hi/lo splits as they are; at
geometries whose dims are no power of two (Mamba2 H=3, P=24, N=40; GDN Hk=3, HV=6, K=40, V=24 and K=96).

The bar is the fp32-state one of issue 25: every output and stored checkpoint within 1e-5 of the fp64
sequential recurrence, relative to the largest magnitude of that tensor (normwise), on random inputs.
"""

from __future__ import annotations

import pytest
import torch

from kernel_testlib import make_gen
from replay_cases import run_gdn_decode, run_gdn_materialize, run_gdn_verify, run_mamba2_decode
from replay_cases import run_mamba2_materialize, run_mamba2_verify

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="compiled tensor-core paths: needs CUDA (the interpreter ignores input_precision)")

REL = 1e-5  # fp32-state bar vs the fp64 recurrence, relative to the tensor's largest magnitude
PRECISIONS = ("tf32x3", "ieee")
MAMBA2_ODD = dict(H=3, P=24, N=40, G=1)  # three heads per group
GDN_ODD = {"K40": dict(Hk=3, HV=6, K=40, V=24), "K96": dict(Hk=3, HV=6, K=96, V=24)}


@pytest.fixture
def cuda():
    return torch.device("cuda")


@pytest.fixture
def launch(tmp_path, monkeypatch):
    """Pin one family's default launch entry through a YAML file (SGLANG_REPLAYSSM_KERNEL_CONFIG)."""

    def use(family, **params):
        f = tmp_path / "launch.yaml"
        body = ", ".join(f"{k}: {v}" for k, v in params.items())
        f.write_text(f"{family}:\n  default: {{{body}}}\n")
        monkeypatch.setenv("SGLANG_REPLAYSSM_KERNEL_CONFIG", str(f))

    return use


def _record(monkeypatch, module, kernel, key):
    """The launch keyword ``key`` of every launch of ``module.kernel`` (the launch still runs)."""
    seen, real = [], getattr(module, kernel)

    class Recording:
        def __getitem__(self, grid):
            def go(*args, **kw):
                seen.append(kw[key])
                return real[grid](*args, **kw)
            return go

    monkeypatch.setattr(module, kernel, Recording())
    return seen


def check_fp32_bar(case, seed, what):
    for name, got, want, _ in case:
        err = float((got.double() - want.double()).abs().max())
        scale = float(want.abs().max())
        assert torch.isfinite(got).all(), f"{what}: {name} has non-finite values (seed {seed})"
        assert err <= REL * scale, (f"{what}: {name} off the fp64 recurrence by {err:.3e} > {REL:g} x max|ref| "
                                    f"{scale:.3e} (seed {seed}; replay: REPLAYSSM_TEST_SEED={seed})")


@pytest.mark.parametrize("prec", PRECISIONS)
@pytest.mark.parametrize("unroll", [1, 0], ids=["unrolled", "loop"])
def test_mamba2_decode_flush_dot(cuda, launch, prec, unroll):
    launch("mamba2_output_only", BLOCK_M=16, BLOCK_NC=16, flush_unroll=unroll, dot_precision=prec)
    gen, seed = make_gen()
    L = 5
    check_fp32_bar(run_mamba2_decode(cuda, gen, **MAMBA2_ODD, L=L, w=L - 1, large=False), seed,
                   f"mamba2 decode flush ({prec}, unroll {unroll})")


@pytest.mark.parametrize("prec", PRECISIONS + ("split-a32", "split-a16b"))
@pytest.mark.parametrize("block_nc", [16, 64])
def test_mamba2_verify_flush_dot(cuda, launch, prec, block_nc):
    """A flush row's fold: tl.dot at tf32x3 / ieee, or ``flush_split`` (three tf32 passes over an fp32 x ring,
    two over a bf16 one)."""
    split = prec.startswith("split")
    launch("mamba2_verify", BLOCK_M=16, BLOCK_NC=block_nc, **(dict(flush_split=1) if split else dict(dot_precision=prec)))
    gen, seed = make_gen()
    act = torch.bfloat16 if prec == "split-a16b" else None
    check_fp32_bar(run_mamba2_verify(cuda, gen, **MAMBA2_ODD, T=3, R=9, flush=True, large=False, act=act), seed,
                   f"mamba2 verify flush ({prec}, BLOCK_NC {block_nc})")


@pytest.mark.parametrize("block_m", [16, 32])
@pytest.mark.parametrize("large", [False, True], ids=["small", "large"])
def test_mamba2_verify_nonflush_mma(cuda, launch, block_m, large):
    """``nonflush: mma``: a verify row's S_ck·C_s dots as one tl.dot in tf32 passes over hi/lo halves."""
    launch("mamba2_verify", BLOCK_M=block_m, nonflush="mma")
    gen, seed = make_gen()
    check_fp32_bar(run_mamba2_verify(cuda, gen, **MAMBA2_ODD, T=3, R=9, flush=False, large=large), seed,
                   f"mamba2 verify nonflush mma (BLOCK_M {block_m}, large={large})")


@pytest.mark.parametrize("prec", PRECISIONS)
def test_mamba2_materialize_dot(cuda, prec):
    gen, seed = make_gen()
    check_fp32_bar(run_mamba2_materialize(cuda, gen, **MAMBA2_ODD, L=7, w=6, large=False, dot_precision=prec,
                                          block_m=16, block_nc=16), seed, f"mamba2 materialize ({prec})")


@pytest.mark.parametrize("prec", PRECISIONS)
@pytest.mark.parametrize("geom", list(GDN_ODD))
@pytest.mark.parametrize("tile", ["whole", "kchunk"])
def test_gdn_decode_flush_dot(cuda, launch, monkeypatch, prec, geom, tile):
    import sglang_replayssm.kernels.gdn_replay as gr

    params = dict(flush="dot", dot_precision=prec, BV=16)
    if tile == "kchunk":  # 4 rows: above inline_scores_max_batch, so BKC applies
        params.update(BKC=32, BV=32)
    launch("gdn_decode", **params)
    chunked = _record(monkeypatch, gr, "_gdn_replay_decode_kchunk_kernel", "BKC")
    gen, seed = make_gen()
    L = 5
    check_fp32_bar(run_gdn_decode(cuda, gen, **GDN_ODD[geom], L=L, w=L - 1, large=False), seed,
                   f"gdn decode flush ({tile}, {geom}, {prec})")
    assert chunked == ([32] if tile == "kchunk" else []), f"K-chunked kernel launches: {chunked}"


@pytest.mark.parametrize("prec", PRECISIONS)
@pytest.mark.parametrize("geom", list(GDN_ODD))
def test_gdn_verify_flush_dot(cuda, launch, prec, geom):
    launch("gdn_verify", flush="dot", dot_precision=prec, BV=16, v_loop=1)
    gen, seed = make_gen()
    check_fp32_bar(run_gdn_verify(cuda, gen, **GDN_ODD[geom], T=3, R=9, flush=True, large=False), seed,
                   f"gdn verify flush ({geom}, {prec})")


@pytest.mark.parametrize("prec", PRECISIONS)
@pytest.mark.parametrize("geom", list(GDN_ODD))
def test_gdn_materialize_dot(cuda, prec, geom):
    gen, seed = make_gen()
    check_fp32_bar(run_gdn_materialize(cuda, gen, **GDN_ODD[geom], L=7, w=6, large=False, dot_precision=prec,
                                       block_v=16), seed, f"gdn materialize ({geom}, {prec})")


@pytest.mark.parametrize("flush", [False, True], ids=["verify", "flush"])
@pytest.mark.parametrize("geom", list(GDN_ODD))
@pytest.mark.parametrize("large", [False, True], ids=["small", "large"])
def test_gdn_verify_window_dot(cuda, launch, flush, geom, large):
    """The looping verify kernel's window dots on the tensor cores (``window_dot: split``: hi/lo halves in tf32
    passes), verify or flush rows at odd K and V."""
    launch("gdn_verify", v_loop=2, v_loop_min_batch=1, window_dot="split", BV=16)
    gen, seed = make_gen()
    check_fp32_bar(run_gdn_verify(cuda, gen, **GDN_ODD[geom], T=3, R=9, flush=flush, large=large), seed,
                   f"gdn verify window dots ({geom}, flush={flush}, large={large})")


@pytest.mark.parametrize("window_dot", ["fma", "split"])
@pytest.mark.parametrize("geom", list(GDN_ODD))
@pytest.mark.parametrize("large", [False, True], ids=["small", "large"])
@pytest.mark.parametrize("flush_rows", ["fused", "separate"])
def test_gdn_verify_vloop_fold(cuda, launch, window_dot, geom, large, flush_rows):
    """The looping verify kernel's fold: a flush row's fold and its window dots as tf32 passes over hi/lo halves,
    flush rows at odd K and V (the checkpoint checked too), in the one launch or the flush rows' own."""
    launch("gdn_verify", v_loop=2, v_loop_min_batch=1, window_dot=window_dot, BV=16, flush_rows=flush_rows,
           flush_v_stages=2)
    gen, seed = make_gen()
    check_fp32_bar(run_gdn_verify(cuda, gen, **GDN_ODD[geom], T=3, R=9, flush=True, large=large), seed,
                   f"gdn verify looping fold ({geom}, window_dot {window_dot}, large={large})")
