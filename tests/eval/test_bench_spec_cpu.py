"""CPU tests of the speculative-verify benchmark harness (eval/bench_spec.py).

* The flush cycle the benchmark amortises over is checked against the package's own
  cursor reference (``spec_cursor.spec_commit_ref``) and the closed form.
* Byte counts are checked against an independent derivation: the tensors each kernel
  touches are built on the meta device from their shapes (ring entries from
  ``sglang_replayssm.ring``'s per-slot spec-ring layouts) and their ``nbytes`` summed.
* The end-to-end test runs ``eval.bench_spec.main`` with ``--device cpu`` (what
  ``python -m eval.bench_spec`` runs) in-process, in the Triton
  interpreter on the tiny geometries (batch 1, correctness check at batch 2) and
  validates the JSON and Markdown it writes, including one case's bytes by hand.
* The failure path (correctness check violated -> exit status 1, files still written)
  runs ``main`` in-process with the kernels and the timed cases faked.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from eval import bench_spec as bs  # noqa: E402
from eval import report  # noqa: E402
from sglang_replayssm.kernels.spec_cursor import spec_commit_ref, spec_reset_ref, spec_ring_len  # noqa: E402
from sglang_replayssm.ring import GDNRingGeometry, Mamba2RingGeometry, ring_bytes_per_slot  # noqa: E402

BF16, F32, I32 = torch.bfloat16, torch.float32, torch.int32


def nbytes(*shapes_dtypes) -> int:
    """Sum of nbytes of meta tensors of the given (shape, dtype) pairs."""
    return sum(torch.empty(shape, dtype=dt, device="meta").nbytes for shape, dt in shapes_dtypes)


# --------------------------------------------------------------------------------
# flush cycle
# --------------------------------------------------------------------------------
def test_headline_cycle():
    R = spec_ring_len(16, 4)
    cyc = bs.spec_cycle(4, R, 3)
    assert (cyc["T"], cyc["R"], cyc["B"], cyc["accept"]) == (4, 20, 16, 3)
    assert cyc["length"] == cyc["length_closed_form"] == 5 == (20 - 8) // 3 + 1
    assert [c["wp"] for c in cyc["cycle"]] == [3, 6, 9, 12, 15]
    assert [c["flush"] for c in cyc["cycle"]] == [0, 0, 0, 0, 1]
    assert cyc["flush_wp"] == 15 <= cyc["B"]  # the fold never exceeds the history block
    assert cyc["transient"] == [{"wp": 0, "origin": 0, "flush": 0}]
    # steady-state origins: the first flush moved logical 0 to physical 15
    assert {c["origin"] for c in cyc["cycle"]} == {15}


@pytest.mark.parametrize("T,B,a", [(4, 16, 3), (4, 16, 1), (4, 16, 4), (4, 4, 3), (2, 8, 2), (8, 8, 8), (3, 20, 2),
                                   (1, 1, 1)])
def test_cycle_matches_commit_reference(T, B, a):
    """The simulated cycle equals what the package's cursor reference does step by step."""
    R = spec_ring_len(B, T)
    cyc = bs.spec_cycle(T, R, a)
    L = cyc["length"]
    assert L == (R - 2 * T) // a + 1 == len(cyc["cycle"])
    S = 3
    wp, org, fl = (torch.zeros(S, dtype=I32) for _ in range(3))
    slots = torch.tensor([1], dtype=I32)
    spec_reset_ref(wp, org, fl, slots, window=T, ring_len=R)
    n0 = len(cyc["transient"])
    seq = []
    for _ in range(n0 + 3 * L):
        seq.append({"wp": int(wp[1]), "origin": int(org[1]), "flush": int(fl[1])})
        assert seq[-1]["wp"] + T <= R  # the verify window always fits the ring
        spec_commit_ref(wp, org, fl, slots, torch.tensor([a], dtype=I32), window=T, ring_len=R)
    assert seq[:n0] == cyc["transient"]
    assert seq[n0 + L:n0 + 2 * L] == cyc["cycle"]  # the steady pass the benchmark times
    for k in range(3):
        part = seq[n0 + k * L:n0 + (k + 1) * L]
        assert [(s["wp"], s["flush"]) for s in part] == [(c["wp"], c["flush"]) for c in cyc["cycle"]]
        assert [s["flush"] for s in part].count(1) == 1 and part[-1]["flush"] == 1
    # and the pure-Python rule agrees with the reference on one step from every state
    for c in cyc["transient"] + cyc["cycle"]:
        w, o, f = (torch.zeros(S, dtype=I32) for _ in range(3))
        w[1], o[1], f[1] = c["wp"], c["origin"], c["flush"]
        spec_commit_ref(w, o, f, slots, torch.tensor([a], dtype=I32), window=T, ring_len=R)
        assert bs.commit_rule(c["wp"], c["origin"], c["flush"], a, T, R) == (int(w[1]), int(o[1]), int(f[1]))


def test_cycle_rejects_bad_settings():
    for T, R, a in ((4, 20, 0), (4, 20, 5), (4, 7, 3), (0, 20, 1)):
        with pytest.raises(ValueError):
            bs.spec_cycle(T, R, a)


# --------------------------------------------------------------------------------
# bytes model
# --------------------------------------------------------------------------------
def _sb(dt):
    return torch.empty((), dtype=dt).element_size()


def hand_mamba2(b, H, P, N, G, T, B_hist, sdt, cycle):
    """Stock and ours (amortised over ``cycle``) bytes of one Mamba2 verify step, from shapes."""
    R = B_hist + T
    window = nbytes(((b, T, H, P), BF16), ((b, T, H), BF16), ((b, T, G, N), BF16), ((b, T, G, N), BF16),
                    ((H,), F32), ((H,), BF16), ((H,), BF16))
    out = nbytes(((b, T, H, P), BF16))
    state = nbytes(((b, H, P, N), sdt))
    snapshots = nbytes(((b, T, H, P, N), sdt))
    idx = nbytes(((b,), I32))
    stock = (state + snapshots + window + out + 2 * idx  # SSU: state, snapshots, slot + buffer index
             + state + state + 2 * idx)  # scatter: snapshot read, state write, slot + step index
    geom = Mamba2RingGeometry(nheads=H, head_dim=P, dstate=N, ngroups=G, buffer_len=B_hist, act_dtype=BF16)
    assert ring_bytes_per_slot(geom, spec_window=T) % R == 0
    entry = ring_bytes_per_slot(geom, spec_window=T) // R
    assert entry == nbytes(((H, P), BF16), ((G, N), BF16), ((H,), F32))
    commit = 2 * idx + 6 * idx  # slot + accepted, three cursors read and written
    per = [state + (state if (c["flush"] and c["wp"] > 0) else 0) + b * c["wp"] * entry + b * T * entry
           + window + out + idx + 3 * idx + commit for c in cycle]
    return stock, sum(per) / len(per), per


def hand_gdn(b, HV, Hk, K, V, T, B_hist, sdt, cycle):
    R = B_hist + T
    window = nbytes(((b, T, 2 * Hk * K + HV * V), BF16), ((b, T, HV), BF16), ((b, T, HV), BF16), ((HV,), F32),
                    ((HV,), BF16))
    out = nbytes(((b, T, HV, V), BF16))
    state = nbytes(((b, HV, V, K), sdt))
    snapshots = nbytes(((b, T, HV, V, K), sdt))
    idx = nbytes(((b,), I32))
    cu = nbytes(((b + 1,), I32))
    stock = state + snapshots + window + out + 2 * idx + cu + state + state + 2 * idx
    geom = GDNRingGeometry(num_k_heads=Hk, num_v_heads=HV, head_k_dim=K, head_v_dim=V, buffer_len=B_hist,
                           act_dtype=BF16, state_dtype=sdt)
    entry = ring_bytes_per_slot(geom, spec_window=T) // R
    assert entry == nbytes(((HV, V), sdt), ((Hk, K), BF16), ((HV,), F32))
    commit = 8 * idx
    per = [state + (state if (c["flush"] and c["wp"] > 0) else 0) + b * c["wp"] * entry + b * T * entry
           + window + out + 4 * idx + commit for c in cycle]
    return stock, sum(per) / len(per), per


CYCLE = bs.spec_cycle(4, 20, 3)


@pytest.mark.parametrize("b,sdt", [(1, F32), (256, F32), (8, BF16), (2, F32)])
def test_mamba2_bytes(b, sdt):
    H, P, N, G = 128, 64, 128, 8
    stock, ours, per = hand_mamba2(b, H, P, N, G, 4, 16, sdt, CYCLE["cycle"])
    got = bs.mamba2_stock_bytes(b, H, P, N, G, 4, _sb(sdt))
    assert got["total"] == stock
    assert got["total"] == sum(v for k, v in got.items() if k != "total")
    row = H * P * N * _sb(sdt)
    assert got["snapshot_write"] == 4 * b * row and got["state_read"] == got["state_write"] == b * row
    fn = bs.ours_bytes_fn("mamba2", dict(H=H, P=P, N=N, G=G), b, 4, _sb(sdt))
    for c, want in zip(CYCLE["cycle"], per):
        assert fn(c["wp"], c["flush"])["total"] + bs.commit_bytes(b)["total"] == want
    am = bs.ours_amortised_bytes(fn, CYCLE["cycle"], b)
    assert math.isclose(am["total"], ours)
    assert math.isclose(am["state_write"], b * row / 5)  # one flush in the 5-step cycle
    if b >= 8:  # state-dominated: about 7 state passes vs 1.2
        assert 4.5 < got["total"] / am["total"] < 6.0


@pytest.mark.parametrize("b,sdt", [(1, F32), (256, F32), (32, BF16)])
def test_gdn_bytes(b, sdt):
    HV, Hk, K, V = 32, 16, 128, 128
    stock, ours, per = hand_gdn(b, HV, Hk, K, V, 4, 16, sdt, CYCLE["cycle"])
    assert bs.gdn_stock_bytes(b, HV, Hk, K, V, 4, _sb(sdt))["total"] == stock
    fn = bs.ours_bytes_fn("gdn", dict(HV=HV, Hk=Hk, K=K, V=V), b, 4, _sb(sdt))
    assert [fn(c["wp"], c["flush"])["total"] + bs.commit_bytes(b)["total"] for c in CYCLE["cycle"]] == per
    assert math.isclose(bs.ours_amortised_bytes(fn, CYCLE["cycle"], b)["total"], ours)


def test_flush_at_empty_history_writes_nothing():
    g = dict(H=4, P=16, N=16, G=2)
    f = bs.ours_bytes_fn("mamba2", g, 2, 4, 4)
    assert f(0, 1)["state_write"] == 0 and f(5, 1)["state_write"] == 2 * 4 * 16 * 16 * 4
    assert f(5, 0)["state_write"] == 0


# --------------------------------------------------------------------------------
# summary / Markdown / plot on a fake result set
# --------------------------------------------------------------------------------
def _fake_case(family, geom, dt, bs_, stock_us, ssu_us, ours_us):
    c = {"family": family, "geometry": geom, "state_dtype": dt, "batch": bs_, "kernels": {
        "stock": {"t_us": stock_us, "t_ssu_us": ssu_us, "t_scatter_us": stock_us - ssu_us, "bytes": 700,
                  "GBps": 1000.0, "bw_fraction": 0.25},
        "ours": {"t_amort_us": ours_us, "t_cycle_us": ours_us * 1.01, "t_nonflush_mean_us": ours_us * 0.9,
                 "t_flush_us": ours_us * 1.4, "t_commit_us": 2.0, "bytes_amort": 140, "GBps": 3000.0,
                 "bw_fraction": 0.7}}}
    bs._case_summary(c)
    return c


def _fake_result(passed=True):
    cases = []
    for dt in bs.STATE_DTYPES:
        for b in (1, 8, 256):
            cases.append(_fake_case("mamba2", "nemotron-h-8b", dt, b, 500.0, 400.0, 100.0))
            cases.append(_fake_case("gdn", "qwen3-next-80b", dt, b, 300.0, 240.0, 75.0))
    checks = [{"family": f, "batch": 8, "passed": passed, "first_window_max_abs_diff": 1e-7,
               "max_abs_diff_vs_stock": 2e-7, "ours_max_rel_err_vs_fp64": 1e-7, "stock_max_rel_err_vs_fp64": 1e-7,
               "steps": 7, "flush_steps": [5], "cursors_follow_cycle": True} for f in ("mamba2", "gdn")]
    result = {"git_commit": "abc", "sglang_version": "0.5.17", "gpu": "fake", "device": "cuda", "mode": "full",
              "copy_bw_GBps": 4000.0, "spec": CYCLE, "cases": cases, "correctness": checks, "notes": ["a note"],
              "fairness_notes": ["fair"]}
    result["summary"] = bs.build_summary(cases, {"mamba2": ["nemotron-h-8b"], "gdn": ["qwen3-next-80b"]},
                                         {"mamba2": "nemotron-h-8b", "gdn": "qwen3-next-80b"}, checks)
    return result


def test_summary_keys():
    s = _fake_result()["summary"]
    for k in ("mamba2_verify_speedup_bs256_fp32", "gdn_verify_speedup_bs256_fp32", "mamba2_verify_speedup_bs1_fp32",
              "gdn_verify_speedup_bs1_fp32", "mamba2_verify_speedup_vs_ssu_only_bs256_fp32",
              "gdn_verify_bw_fraction_bs256_bf16"):
        assert k in s, k
    assert math.isclose(s["mamba2_verify_speedup_bs256_fp32"], 5.0)
    assert math.isclose(s["mamba2_verify_speedup_vs_ssu_only_bs256_fp32"], 4.0)
    assert math.isclose(s["gdn_verify_speedup_bs1_fp32"], 4.0)
    assert s["correctness_passed"] is True
    assert s["by_geometry"]["gdn"]["qwen3-next-80b"]["bf16"]["8"]["t_stock_us"] == 300.0
    assert _fake_result(passed=False)["summary"]["correctness_passed"] is False
    err = bs.build_summary([], {}, {}, [{"family": "gdn", "error": "boom"}])
    assert err["correctness_passed"] is False  # a check that could not run is not a pass
    assert bs.build_summary([], {}, {}, [], check_required=False)["correctness_passed"] is None


def test_markdown_and_plot(tmp_path):
    result = _fake_result()
    out = tmp_path / "spec-fake.json"
    report.write_json(out, result)
    md = out.with_suffix(".md")
    report.write_markdown(md, "t", bs.markdown_report(result))
    body = md.read_text()
    for sec in ("## Flush cycle", "## Correctness", "## Mamba2 verify", "## GDN verify", "## Summary", "## Notes"):
        assert sec in body, sec
    assert "wp=15*" in body and "error" not in body.split("## Mamba2 verify")[1].split("\n")[2]
    line = next(ln for ln in body.splitlines() if ln.startswith("| nemotron-h-8b | fp32 | 256 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[5] == "500.0" and cells[9] == "100.0" and cells[11] == "5.00" and cells[12] == "4.00"
    assert "nemotron-h-8b" in bs.stdout_table(result)
    drew = bs.plot_report(result, out.with_suffix(".png"))
    assert drew == report.have_matplotlib() == out.with_suffix(".png").exists()


# --------------------------------------------------------------------------------
# end to end in the interpreter
# --------------------------------------------------------------------------------
def test_cpu_end_to_end(tmp_path, monkeypatch, capsys):
    """``main`` in this process (the interpreter: TRITON_INTERPRET=1 from tests/conftest.py), as
    ``python -m eval.bench_spec --device cpu`` runs it: a subprocess would only add its start-up."""
    out = tmp_path / "spec-cpu.json"
    monkeypatch.setenv("GIT_COMMIT", "test-commit")
    t0 = time.time()
    rc = bs.main(["--device", "cpu", "--quick", "--out", str(out), "--dtypes", "fp32", "--batches", "1",
                  "--check-batch", "2"])
    wall = time.time() - t0
    printed = capsys.readouterr()
    assert rc == 0, printed.out[-4000:] + printed.err[-4000:]
    res = json.loads(out.read_text())
    for k in ("git_commit", "sglang_version", "gpu", "torch", "triton", "copy_bw_GBps", "spec", "cases", "summary",
              "correctness", "stock", "ours", "valid"):
        assert k in res, k
    assert res["git_commit"] == "test-commit" and res["sglang_version"]
    assert res["copy_bw_GBps"] > 0 and res["valid"] is True
    assert res["stock"]["errors"] == {} and all(res["stock"]["available"].values()), res["stock"]
    spec = res["spec"]
    assert (spec["T"], spec["R"], spec["accept"], spec["length"]) == (4, 20, 3, 5)
    for k in ("mamba2_verify_speedup_bs256_fp32", "gdn_verify_speedup_bs256_fp32", "mamba2_verify_speedup_bs1_fp32",
              "gdn_verify_speedup_bs1_fp32"):
        assert k in res["summary"], k

    # correctness: passed, with real numbers, over the reset window, a full cycle and the flush
    assert res["summary"]["correctness_passed"] is True
    checks = {c["family"]: c for c in res["correctness"]}
    assert set(checks) == {"mamba2", "gdn"}
    for fam, chk in checks.items():
        assert "error" not in chk, chk.get("error")
        assert chk["passed"] is True and chk["cursors_follow_cycle"] is True and chk["batch"] == 2
        assert chk["steps"] == 7 and chk["flush_steps"] == [5]
        assert [p["wp"] for p in chk["per_step"]] == [0, 3, 6, 9, 12, 15, 3]
        for p in chk["per_step"]:
            assert p["finite"] and p["within_tol"]
            assert report.is_number(p["max_abs_diff_vs_stock"]) and 0 <= p["max_abs_diff_vs_stock"] <= 1e-3
            assert p["max_abs_stock"] > 0.1  # real outputs, not zeros
            assert p["ours_rel_err_vs_fp64"] < 1e-4 and p["stock_rel_err_vs_fp64"] < 1e-4

    cases = {c["family"]: c for c in res["cases"]}
    assert set(cases) == {"mamba2", "gdn"}
    for c in res["cases"]:
        assert "error" not in c, c.get("error")
        assert c["finite"] is True and c["batch"] == 1 and c["cycle_length"] == 5
        st, ours = c["kernels"]["stock"], c["kernels"]["ours"]
        assert st["t_us"] > 0 and st["t_ssu_us"] > 0 and st["t_scatter_us"] > 0
        assert set(ours["phase_us"]) == {"0", "2", "3", "4"}  # --quick: bench_kernels.quick_phases(5)
        assert ours["t_amort_us"] > 0 and ours["t_cycle_us"] > 0 and ours["t_commit_us"] > 0
        assert ours["cycle_cursors_returned"] is True
        assert ours["reset_phase"]["wp"] == 0
        assert c["speedup"] > 0 and c["speedup_vs_ssu_only"] > 0

    # bytes of both tiny cases by hand (from shapes)
    g = cases["mamba2"]["shape"]
    stock, ours, _ = hand_mamba2(1, g["H"], g["P"], g["N"], g["G"], 4, 16, F32, spec["cycle"])
    assert cases["mamba2"]["kernels"]["stock"]["bytes"] == stock
    assert math.isclose(cases["mamba2"]["kernels"]["ours"]["bytes_amort"], ours)
    g = cases["gdn"]["shape"]
    stock, ours, _ = hand_gdn(1, g["HV"], g["Hk"], g["K"], g["V"], 4, 16, F32, spec["cycle"])
    assert cases["gdn"]["kernels"]["stock"]["bytes"] == stock
    assert math.isclose(cases["gdn"]["kernels"]["ours"]["bytes_amort"], ours)

    md = out.with_suffix(".md").read_text()
    for sec in ("## Correctness", "## Mamba2 verify", "## GDN verify", "## Summary"):
        assert sec in md, sec
    assert out.with_suffix(".png").exists() == report.have_matplotlib()
    print(f"end-to-end wall {wall:.1f}s")


# --------------------------------------------------------------------------------
# a failed correctness check fails the run (files still written)
# --------------------------------------------------------------------------------
class _FakeKernels:
    def __init__(self, device):
        self.errors = {}
        self.spec_commit = object()

    @staticmethod
    def spec_ring_len(B, T):
        return B + T

    def stock_ok(self, family):
        return True

    ours_ok = stock_ok

    def info(self):
        return {"fake": True}


def test_failed_check_exits_1(tmp_path, monkeypatch):
    monkeypatch.setattr(bs, "Kernels", _FakeKernels)
    monkeypatch.setattr(bs, "ours_launch_info", lambda *a, **k: {})

    def fake_check(family, geom, kern, spec, batch, device, steps=None, seed=1234):
        return {"family": family, "batch": batch, "passed": family != "gdn", "first_window_max_abs_diff": 0.5,
                "max_abs_diff_vs_stock": 0.5, "ours_max_rel_err_vs_fp64": 0.1, "stock_max_rel_err_vs_fp64": 1e-7,
                "steps": 7, "flush_steps": [5], "cursors_follow_cycle": True}

    def fake_case(family, name, geom, batch, sdtype, *a, **k):
        return _fake_case(family, name, sdtype, batch, 10.0, 8.0, 2.0)

    monkeypatch.setattr(bs, "check_family", fake_check)
    monkeypatch.setattr(bs, "run_case", fake_case)
    out = tmp_path / "fail.json"
    rc = bs.main(["--device", "cpu", "--out", str(out), "--batches", "1", "--dtypes", "fp32"])
    assert rc == 1
    res = json.loads(out.read_text())
    assert res["valid"] is False and res["summary"]["correctness_passed"] is False
    assert res["notes"][0].startswith("!! CORRECTNESS CHECK FAILED")
    assert out.with_suffix(".md").is_file()
    # --no-check: no gate
    rc = bs.main(["--device", "cpu", "--out", str(out), "--batches", "1", "--dtypes", "fp32", "--no-check"])
    assert rc == 0 and json.loads(out.read_text())["valid"] is None
