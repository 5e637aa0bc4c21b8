"""CPU tests of the kernel-benchmark harness (eval/bench_kernels.py, eval/report.py).

Byte counts are checked against an independent derivation: the tensors each kernel
touches are built on the meta device from their shapes (ring entries from
``sglang_replayssm.ring``'s per-slot layouts) and their ``nbytes`` summed.  The
end-to-end test runs ``eval.bench_kernels.main`` with ``--device cpu`` (what
``python -m eval.bench_kernels`` runs) in-process, in the Triton interpreter, and
validates the JSON it writes.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from eval import bench_kernels as bk  # noqa: E402
from eval import report  # noqa: E402
from sglang_replayssm.ring import GDNRingGeometry, Mamba2RingGeometry, ring_bytes_per_slot  # noqa: E402

BF16, F32 = torch.bfloat16, torch.float32


def nbytes(*shapes_dtypes) -> int:
    """Sum of nbytes of meta tensors of the given (shape, dtype) pairs."""
    return sum(torch.empty(shape, dtype=dt, device="meta").nbytes for shape, dt in shapes_dtypes)


# --------------------------------------------------------------------------------
# bytes model
# --------------------------------------------------------------------------------
MAMBA2_CASES = [  # (b, H, P, N, G, L, state dtype)
    (1, 128, 64, 128, 8, 16, F32),
    (256, 128, 64, 128, 8, 16, BF16),
    (3, 4, 16, 16, 2, 4, F32),
    (512, 256, 64, 128, 8, 16, F32),
]
GDN_CASES = [  # (b, HV, Hk, K, V, L, state dtype)
    (1, 32, 16, 128, 128, 16, F32),
    (256, 64, 16, 128, 128, 16, BF16),
    (3, 4, 2, 32, 32, 4, F32),
]


def _sb(dt):
    return torch.empty((), dtype=dt).element_size()


def _mamba2_common(b, H, P, N, G):
    ins = nbytes(((b, H, P), BF16), ((b, H), BF16), ((b, G, N), BF16), ((b, G, N), BF16), ((b,), torch.int32),
                 ((H,), F32), ((H,), BF16), ((H,), BF16))
    outs = nbytes(((b, H, P), BF16))
    return ins, outs


@pytest.mark.parametrize("b,H,P,N,G,L,sdt", MAMBA2_CASES)
def test_mamba2_stock_bytes(b, H, P, N, G, L, sdt):
    got = bk.mamba2_stock_bytes(b, H, P, N, G, _sb(sdt))
    ins, outs = _mamba2_common(b, H, P, N, G)
    state = nbytes(((b, H, P, N), sdt))
    assert got["state_read"] == state and got["state_write"] == state
    assert got["total"] == 2 * state + ins + outs
    assert got["total"] == sum(v for k, v in got.items() if k != "total")


@pytest.mark.parametrize("b,H,P,N,G,L,sdt", MAMBA2_CASES)
def test_mamba2_replay_bytes(b, H, P, N, G, L, sdt):
    geom = Mamba2RingGeometry(nheads=H, head_dim=P, dstate=N, ngroups=G, buffer_len=L, act_dtype=BF16)
    assert ring_bytes_per_slot(geom) % L == 0
    entry = ring_bytes_per_slot(geom) // L  # one ring position of one slot: x [H,P], B [G,N], dt [H]
    assert entry == nbytes(((H, P), BF16), ((G, N), BF16), ((H,), F32))
    ins, outs = _mamba2_common(b, H, P, N, G)
    ins += nbytes(((b,), torch.int32))  # write_pos
    state = nbytes(((b, H, P, N), sdt))
    for w in range(L):
        got = bk.mamba2_replay_bytes(b, H, P, N, G, L, w, _sb(sdt))
        flush = w == L - 1
        ring_read = nbytes(((b, H, w, P), BF16), ((b, G, w, N), BF16), ((b, H, w), F32))
        assert got["ring_read"] == ring_read == b * w * entry
        assert got["ring_append"] == (0 if flush else b * entry)
        assert got["state_read"] == state
        assert got["state_write"] == (state if flush else 0)
        assert got["total"] == state + (state if flush else 0) + ring_read + (0 if flush else b * entry) + ins + outs
    # the non-flush step moves about half the stock bytes when the state dominates
    stock = bk.mamba2_stock_bytes(b, H, P, N, G, _sb(sdt))["total"]
    assert bk.mamba2_replay_bytes(b, H, P, N, G, L, 0, _sb(sdt))["total"] < 0.6 * stock
    with pytest.raises(ValueError):
        bk.mamba2_replay_bytes(b, H, P, N, G, L, L, _sb(sdt))


@pytest.mark.parametrize("b,HV,Hk,K,V,L,sdt", GDN_CASES)
def test_gdn_bytes(b, HV, Hk, K, V, L, sdt):
    ins = nbytes(((b, 2 * Hk * K + HV * V), BF16), ((b, HV), BF16), ((b, HV), BF16), ((b,), torch.int32),
                 ((HV,), F32), ((HV,), BF16))
    outs = nbytes(((b, HV, V), BF16))
    state = nbytes(((b, HV, V, K), sdt))
    stock = bk.gdn_stock_bytes(b, HV, Hk, K, V, _sb(sdt))
    assert stock["total"] == 2 * state + ins + outs

    # ours: the ring layout of sglang_replayssm.ring (d in the state dtype, raw k in bf16, g fp32)
    geom = GDNRingGeometry(num_k_heads=Hk, num_v_heads=HV, head_k_dim=K, head_v_dim=V, buffer_len=L,
                           act_dtype=BF16, state_dtype=sdt)
    entry = ring_bytes_per_slot(geom) // L
    assert entry == nbytes(((HV, V), sdt), ((Hk, K), BF16), ((HV,), F32))
    # upstream: d and k in the SSM dtype (memory_pool.py), plus a force_flush int32 per row
    up_entry = nbytes(((HV, V), sdt), ((Hk, K), sdt), ((HV,), F32))
    wp = nbytes(((b,), torch.int32))
    for w in range(L):
        flush = w == L - 1
        ours = bk.gdn_replay_bytes(b, HV, Hk, K, V, L, w, _sb(sdt))
        assert ours["total"] == (state + (state if flush else 0) + b * w * entry + (0 if flush else b * entry)
                                 + ins + wp + outs)
        up = bk.gdn_replay_bytes(b, HV, Hk, K, V, L, w, _sb(sdt), d_bytes=_sb(sdt), k_bytes=_sb(sdt),
                                 extra_row_bytes=4)
        assert up["total"] == (state + (state if flush else 0) + b * w * up_entry + (0 if flush else b * up_entry)
                               + ins + 2 * wp + outs)


def test_amortised_bytes_closed_form():
    b, H, P, N, G, L, sb = 8, 128, 64, 128, 8, 16, 4
    am = bk.amortised_bytes(lambda w: bk.mamba2_replay_bytes(b, H, P, N, G, L, w, sb), L)
    state = b * H * P * N * sb
    entry = H * P * 2 + G * N * 2 + H * 4
    assert am["state_read"] == state
    assert math.isclose(am["state_write"], state / L)
    assert math.isclose(am["ring_read"], b * entry * (L - 1) / 2)  # mean of w over 0..L-1
    assert math.isclose(am["ring_append"], b * entry * (L - 1) / L)
    assert math.isclose(am["total"], sum(v for k, v in am.items() if k != "total"))


# --------------------------------------------------------------------------------
# amortisation, bandwidth, slot sets
# --------------------------------------------------------------------------------
def test_mixed_launch_cursor_and_bytes():
    """The mixed launch: row i at phase i % L; its bytes the row-weighted mean of the per-phase bytes."""
    import torch

    assert bk.mixed_wpos(7, 3, "cpu").tolist() == [0, 1, 2, 0, 1, 2, 0]
    per_phase = lambda w: {"total": 100 * (w + 1)}  # noqa: E731
    assert bk.mixed_bytes(per_phase, 3, 7) == pytest.approx((3 * 100 + 2 * 200 + 2 * 300) / 7)
    assert bk.mixed_bytes(per_phase, 4, 8) == pytest.approx(250.0)  # whole cycles: the plain mean
    assert bk.mixed_wpos(4, 4, "cpu").dtype == torch.int32
    # the same phases, flush rows (phase L - 1) first or last
    assert bk.mixed_wpos(7, 3, "cpu", "flush-first").tolist() == [2, 2, 1, 1, 0, 0, 0]
    assert bk.mixed_wpos(7, 3, "cpu", "flush-last").tolist() == [0, 0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="mixed order"):
        bk.mixed_wpos(7, 3, "cpu", "random")


def test_amortise_all_phases_is_plain_mean():
    L = 16
    times = {w: 10.0 + w for w in range(L - 1)}
    times[L - 1] = 50.0
    assert math.isclose(bk.amortise(times, L), sum(times.values()) / L)


def test_amortise_subset_formula():
    L = 16
    times = {0: 10.0, 8: 12.0, 14: 14.0, 15: 40.0}
    expect = ((L - 1) * (10.0 + 12.0 + 14.0) / 3 + 40.0) / L
    assert math.isclose(bk.amortise(times, L), expect)
    assert bk.quick_phases(L) == [0, 8, 14, 15]
    assert bk.quick_phases(4) == [0, 2, 3]


def test_amortise_edge_cases():
    assert bk.amortise({0: 7.0}, 1) == 7.0            # L = 1: every step flushes
    assert bk.amortise({0: 1.0, 1: 2.0}, 4) is None   # flush phase missing
    assert bk.amortise({3: 5.0}, 4) is None           # no non-flush phase
    assert bk.amortise({0: float("nan"), 3: 5.0}, 4) is None


def test_gbps_and_slot_sets():
    assert math.isclose(bk.gbps(4e9, 1e6), 4.0)       # 4 GB in 1 s
    assert bk.gbps(None, 1.0) is None and bk.gbps(1.0, 0.0) is None
    for b, row in ((1, 4 << 20), (8, 2 << 20), (256, 4 << 20), (512, 8 << 20)):
        n = bk.slot_sets_needed(b, row)
        assert n >= 1
        assert n * b * row >= bk.TOUCH_FACTOR * bk.L2_BYTES or n == bk.MAX_SETS
        if n > 1:  # minimal: one set fewer would not be enough
            assert (n - 1) * b * row < bk.TOUCH_FACTOR * bk.L2_BYTES


# --------------------------------------------------------------------------------
# summary / JSON / Markdown on a fake result set
# --------------------------------------------------------------------------------
def _fake_case(family, geom, dt, bs, stock_us, ours_us, up_us=None):
    c = {"family": family, "geometry": geom, "state_dtype": dt, "batch": bs, "kernels": {
        "stock": {"t_us": stock_us, "GBps": 1000.0, "bw_fraction": 0.25}}}
    if family == "mamba2":
        c["kernels"]["replay_output_only"] = {"t_amort_us": ours_us, "GBps": 3000.0, "bw_fraction": 0.75,
                                              "t_nonflush_mean_us": ours_us * 0.9, "t_flush_us": ours_us * 2}
        # a second ReplaySSM variant (result files of older commits timed a second Mamba2 route): fastest
        # mixed, not the best amortised
        c["kernels"]["replay_slower"] = {"t_amort_us": ours_us * 1.5, "GBps": 2000.0, "bw_fraction": 0.5,
                                         "t_mixed_us": ours_us * 0.5}
        if bs > 1:
            c["kernels"]["replay_output_only"]["t_mixed_us"] = ours_us * 0.8
    else:
        c["kernels"]["replay"] = {"t_amort_us": ours_us, "GBps": 3000.0, "bw_fraction": 0.7}
        if up_us is not None:
            c["kernels"]["upstream_replay"] = {"t_amort_us": up_us, "GBps": float("nan")}
        if bs > 1:  # the mixed launch (batch >= L)
            c["kernels"]["replay"]["t_mixed_us"] = ours_us * 0.8
            if up_us is not None:
                c["kernels"]["upstream_replay"]["t_mixed_us"] = up_us * 0.9
    bk._case_summary(c)
    return c


def _fake_result():
    cases = []
    for dt in bk.STATE_DTYPES:
        for bs in (1, 256):
            cases.append(_fake_case("mamba2", "nemotron-h-8b", dt, bs, 100.0, 60.0))
            cases.append(_fake_case("mamba2", "nemotron-h-large", dt, bs, 200.0, 100.0))
            cases.append(_fake_case("gdn", "qwen3-next-80b", dt, bs, 80.0, 50.0, up_us=60.0))
    result = {"git_commit": "abc", "sglang_version": "0.5.17", "gpu": "fake", "torch": "x", "triton": "y",
              "device": "cuda", "L": 16, "mode": "full", "copy_bw_GBps": 4000.0, "cases": cases,
              "correctness": [{"family": "mamba2", "batch": 8, "out_rel_err_vs_fp64": {"stock": 1e-3, "output_only": 2e-3},
                               "out_max_abs_diff_vs_stock": {"output_only": 1e-3},
                               "state_rel_err_vs_fp64_after_flush": {"stock": 1e-7, "output_only": 2e-7},
                               "outputs_all_written_finite": {"stock": True, "output_only": True}},
                              {"family": "gdn", "error": "boom"}],
              "notes": ["a note"]}
    result["summary"] = bk.build_summary(cases, ["nemotron-h-8b", "nemotron-h-large"],
                                         ["qwen3-next-80b", "qwen3.5-122b"], dict(bk.HEADLINE))
    return result


def test_case_summary_picks_best_route():
    c = _fake_case("mamba2", "g", "fp32", 8, 100.0, 60.0)
    assert c["best"] == "replay_output_only" and c["best_route"] == "output_only"
    assert math.isclose(c["speedup"], 100.0 / 60.0)
    assert math.isclose(c["speedup_by_variant"]["replay_slower"], 100.0 / 90.0)
    g = _fake_case("gdn", "g", "fp32", 8, 80.0, 50.0, up_us=60.0)
    assert math.isclose(g["vs_upstream"], 60.0 / 50.0)
    assert math.isclose(g["upstream_speedup"], 80.0 / 60.0)
    missing = {"family": "gdn", "kernels": {"replay": {"t_amort_us": 5.0}}}
    bk._case_summary(missing)
    assert missing["speedup"] is None and missing["t_ours_us"] == 5.0
    assert missing["speedup_mixed"] is None and missing["t_ours_mixed_us"] is None


def test_case_summary_mixed_launch():
    """The mixed figures read the variant that is best amortised (Mamba2: output_only, not the faster mixed
    second variant), and are absent below batch L."""
    c = _fake_case("mamba2", "g", "fp32", 256, 100.0, 60.0)
    assert math.isclose(c["t_ours_mixed_us"], 48.0) and math.isclose(c["speedup_mixed"], 100.0 / 48.0)
    g = _fake_case("gdn", "g", "fp32", 256, 80.0, 50.0, up_us=60.0)
    assert math.isclose(g["speedup_mixed"], 80.0 / 40.0) and math.isclose(g["vs_upstream_mixed"], 54.0 / 40.0)
    g1 = _fake_case("gdn", "g", "fp32", 1, 80.0, 50.0, up_us=60.0)
    assert g1["speedup_mixed"] is None and g1["vs_upstream_mixed"] is None
    s = _fake_result()["summary"]
    assert math.isclose(s["gdn_decode_speedup_mixed_bs256_fp32"], 80.0 / 40.0)
    assert math.isclose(s["gdn_decode_vs_upstream_mixed_bs256_fp32"], 54.0 / 40.0)
    assert math.isclose(s["mamba2_decode_speedup_mixed_bs256_fp32"], 100.0 / 48.0)
    assert not any(k.endswith(("mixed_bs1_fp32", "mixed_bs1_bf16")) for k in s)


def test_summary_keys():
    s = _fake_result()["summary"]
    for k in ("mamba2_decode_speedup_bs256_fp32", "mamba2_decode_bw_fraction_bs256_fp32",
              "mamba2_decode_speedup_bs1_fp32", "gdn_decode_speedup_bs256_fp32",
              "gdn_decode_vs_upstream_bs256_fp32"):
        assert k in s
    assert math.isclose(s["mamba2_decode_speedup_bs256_fp32"], 100.0 / 60.0)
    assert math.isclose(s["mamba2_decode_bw_fraction_bs256_fp32"], 0.75)
    assert math.isclose(s["gdn_decode_vs_upstream_bs256_fp32"], 1.2)
    assert math.isclose(s["mamba2_nemotron_h_large_decode_speedup_bs256_fp32"], 2.0)
    assert s["gdn_qwen3_5_122b_decode_speedup_bs256_fp32"] is None  # not run
    assert s["by_geometry"]["gdn"]["qwen3-next-80b"]["bf16"]["1"]["t_stock_us"] == 80.0


def test_json_markdown_png_outputs(tmp_path):
    result = _fake_result()
    out = tmp_path / "sub" / "kernels-fake.json"
    report.write_json(out, result)
    text = out.read_text()
    assert "NaN" not in text and "Infinity" not in text
    back = json.loads(text)
    assert back["summary"]["gdn_decode_speedup_bs256_fp32"] == pytest.approx(80.0 / 50.0)
    gdn = [c for c in back["cases"] if c["family"] == "gdn"][0]
    assert gdn["kernels"]["upstream_replay"]["GBps"] is None  # NaN sanitised

    md = out.with_suffix(".md")
    report.write_markdown(md, "t", bk.markdown_report(result))
    body = md.read_text()
    assert "## Mamba2 decode" in body and "## GDN decode" in body and "## Correctness" in body
    for line in body.splitlines():
        if line.startswith("| nemotron-h-8b | fp32 | 256 |"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert cells[6] == "1.67" and cells[5] == "output_only"  # speedup, best route
            break
    else:
        raise AssertionError("Mamba2 bs256 fp32 row missing:\n" + body)
    assert "error: boom" in body

    table = bk.stdout_table(result)
    assert "nemotron-h-8b" in table and "1.67" in table
    drew = bk.plot_report(result, out.with_suffix(".png"))
    assert drew == report.have_matplotlib()
    assert out.with_suffix(".png").exists() == drew


def test_report_helpers():
    t = report.markdown_table(["a", "b"], [["x", 1.23456], ["y|z", None]])
    lines = t.splitlines()
    assert lines[0] == "| a | b |" and lines[1] == "| :--- | ---: |"
    assert lines[2] == "| x | 1.23 |" and lines[3] == "| y\\|z | — |"
    with pytest.raises(ValueError):
        report.markdown_table(["a"], [[1, 2]])
    assert report.fmt(0.256, pct=True) == "25.6%"
    assert report.fmt(float("nan")) == "—"
    assert report.ratio(1.0, 0) is None and report.ratio(3.0, 2.0) == 1.5
    assert report.sanitize({1: (float("inf"), 2)}) == {"1": [None, 2]}


def test_git_commit_env(monkeypatch):
    monkeypatch.setenv("GIT_COMMIT", "deadbeef")
    assert bk.git_commit() == "deadbeef"


# --------------------------------------------------------------------------------
# end to end in the interpreter
# --------------------------------------------------------------------------------
def _kernels_importable():
    try:
        from sglang_replayssm.kernels import gdn_replay, mamba2_replay

        mamba2_replay.mamba2_replay_decode, gdn_replay.gdn_replay_decode
    except Exception as e:  # noqa: BLE001 - any import failure is the skip's reason
        return False, f"{type(e).__name__}: {e}"
    return True, ""


def test_cpu_end_to_end(tmp_path, monkeypatch, capsys):
    """``main`` in this process (the interpreter: TRITON_INTERPRET=1 from tests/conftest.py), as
    ``python -m eval.bench_kernels --device cpu`` runs it: a subprocess would only add its start-up."""
    ok, why = _kernels_importable()
    if not ok:
        pytest.skip(f"kernel modules not importable yet: {why}")
    out = tmp_path / "kernels-cpu.json"
    monkeypatch.setenv("GIT_COMMIT", "test-commit")
    rc = bk.main(["--device", "cpu", "--out", str(out), "--dtypes", "fp32", "--batches", "4"])
    printed = capsys.readouterr()
    assert rc == 0, printed.out[-4000:] + printed.err[-4000:]
    res = json.loads(out.read_text())
    for k in ("git_commit", "sglang_version", "gpu", "torch", "triton", "copy_bw_GBps", "cases", "summary"):
        assert k in res, k
    assert res["git_commit"] == "test-commit"
    assert res["copy_bw_GBps"] > 0
    assert out.with_suffix(".md").is_file()
    fams = {c["family"]: c for c in res["cases"]}
    assert set(fams) == {"mamba2", "gdn"}
    for c in res["cases"]:
        assert "error" not in c, c.get("error")
        assert c["finite"] is True
        ours = [v for k, v in c["kernels"].items() if k.startswith("replay")]
        assert ours and all(v["t_amort_us"] > 0 and v["t_cycle_us"] > 0 for v in ours)
        assert all(set(v["phase_us"]) == {str(w) for w in bk.quick_phases(c["L"])} for v in ours)
        # batch 4 >= L 4: the mixed launch (row i at phase i % L) was timed, with its row-weighted bytes
        assert c["batch"] >= c["L"]
        for v in [v for k, v in c["kernels"].items() if k != "stock"]:
            assert v["t_mixed_us"] > 0 and v["mixed"]["us"] == v["t_mixed_us"]
            assert v["mixed"]["bytes"] == pytest.approx(v["bytes_amort"])  # batch a whole number of cycles
        assert c["speedup_mixed"] > 0 or not res["stock"]["available"][c["family"]]
        if res["stock"]["available"][c["family"]]:
            assert c["kernels"]["stock"]["t_us"] > 0 and c["speedup"] > 0
    assert {k for k in fams["mamba2"]["kernels"] if k.startswith("replay")} == {"replay_output_only"}
    # correctness spot check: ours against the fp64 recurrence (bf16 outputs: ~4e-3)
    checks = {c["family"]: c for c in res["correctness"]}
    assert set(checks) == {"mamba2", "gdn"}
    for fam, keys in (("mamba2", bk.ROUTES), ("gdn", ("ours",))):
        chk = checks[fam]
        assert "error" not in chk, chk.get("error")
        for k in keys:
            assert chk["out_rel_err_vs_fp64"][k] < 1e-2, (fam, k, chk["out_rel_err_vs_fp64"])
            assert chk["state_rel_err_vs_fp64_after_flush"][k] < 1e-4, (fam, k)
            assert chk["outputs_all_written_finite"][k] is True
            assert chk["checkpoint_untouched_before_flush"][k] is True
    if res["stock"]["available"]["mamba2"]:
        assert max(checks["mamba2"]["out_max_abs_diff_vs_stock"].values()) < 5e-2


# --------------------------------------------------------------------------------
# tune_kernels: candidate generation and YAML the config loader accepts
# --------------------------------------------------------------------------------
def test_tune_candidates():
    from eval import tune_kernels as tk

    geom = dict(H=128, P=64, N=128, G=8)
    assert tk.candidate_values("BLOCK_M", 16, geom, tk.SWEEP_VALUES) == [16, 32, 64]
    assert tk.candidate_values("BLOCK_M", 16, dict(P=16), tk.SWEEP_VALUES) == [16]
    assert tk.candidate_values("dot_precision", "tf32x3", geom, tk.SWEEP_VALUES) == ["tf32x3"]
    assert tk.candidate_values("num_warps", 3, geom, tk.SWEEP_VALUES) == [1, 2, 3, 4, 8]
    cur = {"BLOCK_M": 16, "num_warps": 1, "num_stages": 1, "dot_precision": "tf32x3"}
    s1 = tk.stage1_candidates(cur, geom, tk.SWEEP_VALUES)
    assert len(s1) == 3 * 4 and all(c["num_stages"] == 1 and c["dot_precision"] == "tf32x3" for c in s1)
    s2 = tk.stage2_candidates([cur], cur, geom, tk.SWEEP_VALUES)
    assert sorted(c["num_stages"] for c in s2) == [2, 3]
    assert math.isclose(tk.geomean_ratio({"a": 2.0, "b": 8.0}, {"a": 1.0, "b": 2.0}), math.sqrt(8.0))
    assert tk.geomean_ratio({"a": 2.0}, {"a": 1.0, "b": 2.0}) is None


def test_tune_yaml_roundtrip(tmp_path):
    from eval import tune_kernels as tk
    from sglang_replayssm.kernels import common

    results = [{"tuned": {"mamba2_output_only": {"key": "H128_P64_N128_G8_L16",
                                                 "best": {"BLOCK_M": 32, "num_warps": 2, "dot_precision": "tf32x3"}}}},
               {"tuned": {"gdn_decode": {"key": "HV32_HK16_K128_V128_L16", "best": {"BV": 64, "num_warps": 4}}}}]
    tables = tk.tables_from(results)
    p = tmp_path / "h200.yaml"
    p.write_text(tk.yaml_text(tables, ["header line", ""]))
    assert tk.load_yaml(p) == tables
    from sglang_replayssm.kernels.mamba2_replay import LAUNCH_DEFAULTS

    # the packaged default.yaml is read first and may set every parameter the kernel knows
    got = common.launch_config("mamba2_output_only", "H128_P64_N128_G8_L16",
                               dict(LAUNCH_DEFAULTS["mamba2_output_only"]), path=str(p))
    assert {k: got[k] for k in ("BLOCK_M", "num_warps", "dot_precision")} == \
        {"BLOCK_M": 32, "num_warps": 2, "dot_precision": "tf32x3"}
    common.validate_config_file(p)  # the whole written file is a valid launch-config file
    # other geometries keep what they get without the file
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}\n")
    from sglang_replayssm.kernels.gdn_replay import GDN_DEFAULT_LAUNCH

    d = dict(GDN_DEFAULT_LAUNCH)
    assert common.launch_config("gdn_decode", "HV64_HK16_K128_V128_L16", d, path=str(p)) == \
        common.launch_config("gdn_decode", "HV64_HK16_K128_V128_L16", d, path=str(empty))
    assert common.launch_config("gdn_decode", "HV32_HK16_K128_V128_L16", d, path=str(p))["BV"] == 64


def test_resummarize_rebuilds_the_summary_from_the_committed_cases(tmp_path):
    """--resummarize measures nothing: the committed H200 result's summary, rebuilt from its own cases after it was
    emptied, comes back key for key, the batch-32 mixed-phase keys equal to their cases' values."""
    src = json.loads((REPO / "eval" / "results" / "kernels-h200.json").read_text())
    out = tmp_path / "k.json"
    old = dict(src["summary"])
    src["summary"] = {"headline_geometry": old["headline_geometry"]}
    out.write_text(json.dumps(src))
    assert bk.main(["--out", str(out), "--resummarize"]) == 0
    got = json.loads(out.read_text())
    s = got["summary"]
    assert {k: s.get(k) for k in old} == old and "gdn_decode_speedup_mixed_bs32_fp32" in s
    case = next(c for c in got["cases"] if (c["family"], c["geometry"], c["state_dtype"], c["batch"])
                == ("gdn", old["headline_geometry"]["gdn"], "fp32", 32))
    assert s["gdn_decode_speedup_mixed_bs32_fp32"] == case["speedup_mixed"] is not None
    assert {k: v for k, v in got.items() if k != "summary"} == {k: v for k, v in src.items() if k != "summary"}
    assert bk.main(["--out", str(tmp_path / "missing.json"), "--resummarize"]) == 2
