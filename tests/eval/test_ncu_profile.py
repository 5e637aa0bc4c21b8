"""eval/ncu_profile.py and eval/gpu_ncu.sh without a GPU.

* ``run --device cpu`` profiles nothing but launches every region (tiny geometries, Triton interpreter) and writes
  the manifest: its labels, and model bytes equal to the benchmarks' own byte models at the same cursors.
* ``summarize`` is fed a CSV in ncu's raw-page layout (header, units row, quoted cells, thousands separators),
  written here from the manifest with made-up counters: rows are split into regions at the marker kernels, DRAM
  GB/s and the copy fraction come from the counters, a missing counter is None, a marker count that disagrees with
  the manifest is reported.
* ``gpu_ncu.sh`` runs with a stand-in ``ncu`` (NCU=...) that runs the profiled command on the CPU and answers the
  ``--import`` pages from the manifest: the summary and the packed files come out.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from eval import bench_kernels as bk  # noqa: E402
from eval import bench_spec as bs  # noqa: E402
from eval import ncu_profile as npf  # noqa: E402

STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
COLS = ["ID", "Process ID", "Kernel Name", "Block Size", *npf.METRICS.values(), STALL.format("long_scoreboard"),
        STALL.format("barrier"), STALL.format("math_pipe_throttle"), STALL.format("long_scoreboard_not_issued")]


def fake_raw_csv(kernel_rows, drop=()):
    """ncu's --csv --page raw layout: a log line, the header, the units row, one quoted row per kernel (numbers with
    thousands separators).  ``kernel_rows``: (kernel name, {column: value}); columns in ``drop`` are left out."""
    cols = [c for c in COLS if c not in drop]
    buf = io.StringIO()
    buf.write("==PROF== Disconnected from process 1234\n")
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    w.writerow(cols)
    w.writerow(["", "", "", "", *["byte" if "bytes" in c else "" for c in cols[4:]]])
    for i, (name, vals) in enumerate(kernel_rows):
        row = []
        for c in cols:
            if c == "ID":
                row.append(str(i))
            elif c == "Kernel Name":
                row.append(name)
            elif c in vals:
                v = vals[c]
                row.append(f"{v:,}" if isinstance(v, int) else str(v))
            else:
                row.append("1")
        w.writerow(row)
    return buf.getvalue()


def counters(rng, ns=None, rd=None, wr=None):
    return {"gpu__time_duration.sum": ns or rng.randint(10_000, 900_000),
            "dram__bytes_read.sum": rd if rd is not None else rng.randint(10**6, 10**9),
            "dram__bytes_write.sum": wr if wr is not None else rng.randint(10**5, 10**9),
            STALL.format("long_scoreboard"): round(rng.uniform(5, 30), 3), STALL.format("barrier"): 0.5,
            STALL.format("math_pipe_throttle"): round(rng.uniform(0.1, 4), 3),
            STALL.format("long_scoreboard_not_issued"): 99.0}


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    path = tmp_path_factory.mktemp("ncu") / "manifest.json"
    m = npf.run(["verify:mamba2:fp32:2", "decode:gdn:fp32:4"], path, "cpu", seed=3)
    assert json.loads(path.read_text()) == m
    return m


def test_run_profiles_each_region_with_the_benchmarks_byte_models(manifest):
    labels = [r["label"] for r in manifest["regions"]]
    assert labels == ["copy", "verify/mamba2/fp32/b2/ours-nonflush", "verify/mamba2/fp32/b2/ours-flush",
                      "verify/mamba2/fp32/b2/stock", "decode/gdn/fp32/b4/ours-nonflush", "decode/gdn/fp32/b4/ours-flush",
                      "decode/gdn/fp32/b4/ours-mixed", "decode/gdn/fp32/b4/stock"]
    assert manifest["marker"] == npf.MARKER and manifest["skipped"] == []
    reg = {r["label"]: r for r in manifest["regions"]}
    g = npf._geometry("mamba2", tiny=True)[1]
    cyc = bs.spec_cycle(bs.WINDOW, bs.HISTORY + bs.WINDOW, bs.ACCEPT)["cycle"]
    nb = bs.ours_bytes_fn("mamba2", g, 2, bs.WINDOW, 4)
    assert reg["verify/mamba2/fp32/b2/ours-flush"]["cursors"] == cyc[-1] and cyc[-1]["flush"] == 1
    assert reg["verify/mamba2/fp32/b2/ours-flush"]["model_bytes"] == nb(cyc[-1]["wp"], 1)["total"]
    assert reg["verify/mamba2/fp32/b2/ours-nonflush"]["model_bytes"] == nb(cyc[-2]["wp"], 0)["total"]
    gg = npf._geometry("gdn", tiny=True)[1]
    L = 4  # CPU ring length
    assert reg["decode/gdn/fp32/b4/ours-flush"]["model_bytes"] == bk.gdn_replay_bytes(
        4, gg["HV"], gg["Hk"], gg["K"], gg["V"], L, L - 1, 4)["total"]
    assert reg["copy"]["model_bytes"] == 2 * (1 << 20)


def test_verify_cursors_are_set_outside_the_profiled_launch():
    """A verify region's cursors are filled by its ``prepare`` (three fill kernels), never by the launch ncu
    profiles: the region's counters are the verify kernels' alone."""
    w, launches = npf._verify_launches(npf.parse_region("verify:gdn:fp32:2"), "cpu", True, 0)
    calls = []
    real = w.set_cursors
    w.set_cursors = lambda *a: (calls.append(a), real(*a))
    by_name = {name: (info, prepare, launch) for name, info, prepare, launch in launches}
    assert set(by_name) == {"ours-nonflush", "ours-flush", "stock"}
    for name, (info, prepare, launch) in by_name.items():
        calls.clear()
        prepare()
        n = len(calls)
        launch()
        assert len(calls) == n, f"{name}: the profiled launch set cursors"
        if name != "stock":
            assert calls == [tuple(info["cursors"][k] for k in ("wp", "origin", "flush"))]
            assert int(w.flush[w.sets[0]["idx"].long()].max()) == info["cursors"]["flush"]


def test_a_failing_region_group_is_skipped_and_the_rest_profiled(tmp_path, monkeypatch):
    def broken(*a):
        raise MemoryError("out of memory (made up)")

    monkeypatch.setattr(npf, "_verify_launches", broken)
    path = tmp_path / "m.json"
    m = npf.run(["verify:mamba2:fp32:2", "decode:gdn:fp32:2"], path, "cpu", copy=False)
    assert json.loads(path.read_text()) == m
    assert m["skipped"] == [{"region": "verify/mamba2/fp32/b2", "why": "MemoryError: out of memory (made up)"}]
    assert [r["label"] for r in m["regions"]] == ["decode/gdn/fp32/b2/ours-nonflush", "decode/gdn/fp32/b2/ours-flush",
                                                  "decode/gdn/fp32/b2/stock"]
    s = npf.summarize(fake_raw_csv([x for r in m["regions"] for x in ((npf.MARKER, {}), ("k", {}))]), m)
    assert s["problems"] == [] and s["skipped"] == m["skipped"]


@pytest.mark.parametrize("spec", ["verify:mamba2:fp32", "verify:rwkv:fp32:8", "prefill:gdn:fp32:8",
                                  "decode:gdn:fp8:8", "decode:gdn:fp32:0", "decode:gdn:fp32:x"])
def test_bad_region_is_refused(spec):
    with pytest.raises(ValueError, match="region"):
        npf.parse_region(spec)


def test_summary_splits_regions_at_markers_and_derives_bandwidth(manifest):
    rng = random.Random(7)
    regions = manifest["regions"]
    rows, truth = [("stray_kernel", counters(rng))], []
    for i, r in enumerate(regions):
        rows.append((npf.MARKER, counters(rng)))
        n_k = 2 if "mamba2" in r["label"] and "ours" in r["label"] else 1  # a pre-kernel + the main kernel
        ks = [(f"k{i}_{j}", counters(rng)) for j in range(n_k)]
        rows += ks
        truth.append(ks)
    s = npf.summarize(fake_raw_csv(rows), manifest)
    assert [r["label"] for r in s["regions"]] == [r["label"] for r in regions]
    assert s["problems"] == ["1 kernel(s) profiled before the first marker (ignored)"]
    copy_c = truth[0][0][1]
    copy_gbps = (copy_c["dram__bytes_read.sum"] + copy_c["dram__bytes_write.sum"]) / copy_c["gpu__time_duration.sum"]
    assert s["copy_dram_GBps"] == pytest.approx(copy_gbps)
    for got, ks, info in zip(s["regions"], truth, regions):
        assert [k["kernel"] for k in got["kernels"]] == [n for n, _ in ks]
        ns = sum(c["gpu__time_duration.sum"] for _, c in ks)
        by = sum(c["dram__bytes_read.sum"] + c["dram__bytes_write.sum"] for _, c in ks)
        assert got["duration_us"] == pytest.approx(ns / 1e3)
        assert got["dram_bytes"] == by
        assert got["dram_fraction_of_copy"] == pytest.approx(by / ns / copy_gbps)
        assert got["dram_over_model"] == pytest.approx(by / info["model_bytes"])
        assert got["model_fraction_of_copy"] == pytest.approx(info["model_bytes"] / ns / copy_gbps)
        k0 = got["kernels"][0]
        assert list(k0["stalls"]) == sorted(k0["stalls"], key=lambda n: -k0["stalls"][n])
        assert "long_scoreboard_not_issued" not in k0["stalls"]
        assert k0["stalls"]["long_scoreboard"] == ks[0][1][STALL.format("long_scoreboard")]
    md = npf.markdown(s)
    assert "verify/mamba2/fp32/b2/ours-flush" in md and "long_scoreboard" in md


def test_summary_reports_missing_counters_and_marker_mismatch(manifest):
    rng = random.Random(11)
    rows = []
    for _ in manifest["regions"][:-1]:  # one region short
        rows += [(npf.MARKER, counters(rng)), ("k", counters(rng))]
    s = npf.summarize(fake_raw_csv(rows, drop=("dram__bytes_write.sum", npf.METRICS["l2_hit_pct"])), manifest)
    assert any("markers in the profile" in p for p in s["problems"])
    k = s["regions"][0]["kernels"][0]
    assert k["dram_write_bytes"] is None and k["l2_hit_pct"] is None and k["dram_GBps"] is None
    assert s["regions"][0]["dram_bytes"] is None and s["copy_dram_GBps"] is None
    assert k["duration_ns"] is not None


def test_not_an_ncu_page_is_refused():
    with pytest.raises(ValueError, match="Kernel Name"):
        npf.read_raw_csv('"a","b"\n"1","2"\n')


def test_gpu_script_with_a_stand_in_ncu(tmp_path):
    """gpu_ncu.sh end to end: the stand-in ncu runs the profiled command (on the CPU) and answers the imports."""
    shim = tmp_path / "ncu"
    shim.write_text(f"""#!{sys.executable}
import csv, io, json, os, subprocess, sys
sys.path.insert(0, {str(REPO)!r}); sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_ncu_profile import fake_raw_csv, counters
import random
a = sys.argv[1:]
if a == ["--version"]:
    print("NVIDIA (R) Nsight Compute Command Line Profiler (stand-in)"); sys.exit(0)
if a[0] == "--query-metrics":
    print('"Metric Name","Metric Type","Metric Unit","Metric Description"')
    for n in ("dram__bytes", "dram__bytes_read", "dram__bytes_write", "sm__cycles_elapsed"):
        print(f'"{{n}}","Counter","byte","made up"')
    sys.exit(0)
if a[0] == "--import":
    rep = a[1]
    man = json.load(open(os.path.join(os.path.dirname(rep), "manifest.json")))
    if "raw" in a:
        rng = random.Random(1)
        rows = []
        for r in man["regions"]:
            rows += [("_ncu_region_marker", counters(rng)), ("kernel_" + r["label"], counters(rng))]
        sys.stdout.write(fake_raw_csv(rows))
    else:
        print("page", a[a.index("--page") + 1])
    sys.exit(0)
assert a[a.index("--metrics") + 1] == "dram__bytes_read.sum,dram__bytes_write.sum", a
assert "--profile-from-start" in a and "--clock-control" in a and a[a.index("--clock-control") + 1] == "none"
out = a[a.index("-o") + 1]
cmd = a[a.index("-f") + 1:]
cmd[cmd.index("--device") + 1] = "cpu"
rc = subprocess.call(cmd)
open(out + ".ncu-rep", "w").write("report")
sys.exit(rc)
""")
    shim.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "NCU": str(shim), "GPU_PY": sys.executable, "PYTHONPATH": str(REPO),
           "TRITON_INTERPRET": "1"}
    r = subprocess.run(["bash", "eval/gpu_ncu.sh", "decode:mamba2:bf16:2"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    s = json.loads((out / "ncu-h200.json").read_text())
    assert [x["label"] for x in s["regions"]] == ["copy", "decode/mamba2/bf16/b2/ours-nonflush",
                                                  "decode/mamba2/bf16/b2/ours-flush", "decode/mamba2/bf16/b2/stock"]
    assert s["problems"] == [] and s["copy_dram_GBps"] > 0
    assert (out / "ncu-h200.md").is_file() and (out / "ncu-h200.ncu-rep").is_file()
    with tarfile.open(out / "ncu-raw.tgz") as t:
        names = {Path(n).name for n in t.getnames()}
    assert {"manifest.json", "raw.csv", "details.txt", "source-sass.csv", "ncu-run.log"} <= names
