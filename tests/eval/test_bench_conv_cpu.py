"""CPU tests of the chain-verify conv1d benchmark harness (eval/bench_conv.py).

* Bytes per launch against an independent count: the tensors each launch must touch built on the meta device from
  SGLang's layouts (the deduplicated window buffer as the pool allocates it) and their ``nbytes`` summed.
* ``main --device cpu`` in-process (Triton's interpreter, tiny geometries, two launch configurations): the JSON and
  Markdown it writes, the state / window comparison against SGLang's kernel (outputs: CUDA only), the exit status.
* A mismatch makes the exit status 1.
* The config syntax.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from eval import bench_conv as bc  # noqa: E402


def _meta(shape, dtype=torch.bfloat16) -> int:
    return torch.empty(shape, dtype=dtype, device="meta").nbytes


@pytest.mark.parametrize("name", sorted(bc.GEOMETRIES))
@pytest.mark.parametrize("batch,T", [(1, 4), (256, 4), (8, 2)])
def test_launch_bytes(name, batch, T):
    g = bc.GEOMETRIES[name]
    dim, K = g["dim"], g["K"]
    expect = (_meta((batch, dim, T)) * 2                  # x read, outputs written
              + _meta((batch, dim, K - 1)) * 2            # committed inputs read, new ones written
              + _meta((batch, dim, T + K - 2))            # the deduplicated windows written
              + _meta((dim, K)) + _meta((dim,)))          # weights, bias
    assert bc.launch_bytes(g, batch, T, 2) == expect


def test_config_syntax():
    assert bc.parse_config("256x4") == {"BLOCK_F": 256, "num_warps": 4}
    assert bc.config_tag(bc.parse_config("128X2")) == "128x2" and bc.config_tag(None) == "packaged"
    import argparse

    for bad in ("256", "256x4:runs", "axb"):
        with pytest.raises(argparse.ArgumentTypeError):
            bc.parse_config(bad)


def test_main_on_cpu(tmp_path):
    out = tmp_path / "conv.json"
    rc = bc.main(["--device", "cpu", "--out", str(out), "--configs", "16x1", "32x2"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["notes"]
    assert {c["geometry"] for c in res["cases"]} == set(bc.CPU_GEOMETRIES)
    for c in res["cases"]:
        assert set(c["kernels"]) == {"sglang", "ours 16x1", "ours 32x2"}
        assert all(v["state_equal"] and v["window_equal"] and v["out_ok"] is None for v in c["check"].values())
        assert c["bytes_per_launch"] == bc.launch_bytes(bc.CPU_GEOMETRIES[c["geometry"]], c["batch"], c["T"], 2)
        assert c["best_ours"] in c["kernels"] and c["speedup"] > 0
    md = out.with_suffix(".md").read_text()
    assert "ours 32x2" in md and "same as SGLang" in md
    assert any(k.startswith("conv_verify_speedup_tiny_rows") for k in res["summary"])


def test_a_mismatch_fails_the_run(tmp_path, monkeypatch):
    """Our kernel writing one window element wrong: the run still writes its files and exits 1."""
    import sglang_replayssm.kernels.conv_verify as cv

    real = cv.conv1d_verify

    def wrong(*a, **k):
        out = real(*a, **k)
        k["intermediate_conv_window"][0, 0, 0, 0] += 1
        return out

    monkeypatch.setattr(cv, "conv1d_verify", wrong)
    out = tmp_path / "conv.json"
    assert bc.main(["--device", "cpu", "--out", str(out), "--configs", "16x1", "--geometries", "tiny-rows"]) == 1
    res = json.loads(out.read_text())
    assert res["cases"][0]["check"]["16x1"]["window_equal"] is False
    assert "| NO |" in out.with_suffix(".md").read_text()
