"""CPU tests of ``eval.ab --tp N`` (tensor parallelism on every server) and the full-size Qwen3-Next-80B geometry.

No GPU: command lines are checked against SGLang 0.5.17's own argument parser, the recorded result against
an end-to-end run with ``tests/eval/fake_sglang_server.py`` stand-ins, and the geometry against SGLang's
``Qwen3NextConfig`` (its per-rank mamba cache shape at TP=2).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from eval import ab, models  # noqa: E402
from eval.ab import results  # noqa: E402

FAKE = "tests.eval.fake_sglang_server"
FULL = "qwen3-next-80b-a3b"


def _args(*argv):
    return ab.build_parser().parse_args(list(argv))


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tp_flag_reaches_every_server(tmp_path, sglang_parser, tp):
    """``--tp N``: every arm (stock, staged, patched, upstream) and the spec-parity / reference servers get
    ``--tp-size N``, which SGLang's own parser reads back as its tensor-parallel size."""
    args = _args("--model", "tiny-qwen3-next", "--tp", str(tp), "--arms", "stock,staged,patched,upstream",
                 "--spec", "nextn", "--sim-acc-len", "2.5")
    phases = ab.plan_phases(args)
    assert {p.role for p in phases} == {"arm", "spec-parity", "reference"}
    for ph in phases:
        model = ab.prepare_model(args, tmp_path, ph.spec)
        flags = ab.common_server_flags(args, model, ph.spec)
        module, extra = ab.arm_launch(args, ph.kind)
        cmd = ab.launch_cmd("python", module, flags, "127.0.0.1", 31000, extra)
        assert cmd[cmd.index("--tp-size") + 1] == str(tp) and cmd.count("--tp-size") == 1, ph.label
        ns = sglang_parser.parse_args(ab.launch_cmd("python", ab.STOCK_MODULE, flags, "127.0.0.1", 31000)[3:])
        assert ns.tp_size == tp and ns.pp_size == 1, ph.label


def test_tp_is_recorded_and_names_the_results(tmp_path):
    args = _args("--model", "tiny-nemotron-h", "--tp", "2")
    phases = ab.plan_phases(args)
    model = ab.prepare_model(args, tmp_path, False)
    flags = {False: ab.common_server_flags(args, model, False)}
    run = results.run_record(args, ["--tp", "2"], phases, model, flags, [[1, 2, 3]], time.time())
    assert run["tp_size"] == 2 and run["flags"]["harness"]["tp"] == 2
    assert run["flags"]["server_flags"][run["flags"]["server_flags"].index("--tp-size") + 1] == "2"
    assert results.model_tag("tiny-nemotron-h", args) == "tiny-nemotron-h-tp2"
    assert results.model_tag("tiny-nemotron-h", _args()) == "tiny-nemotron-h"  # single-GPU names unchanged
    one = results.run_record(_args(), [], ab.plan_phases(_args()), model,
                             {False: ab.common_server_flags(_args(), model, False)}, [[1]], time.time())
    assert one["tp_size"] == 1


def test_tp_bad_values_fail_naming_the_flag(capsys):
    assert ab.main(["--tp", "0", "--dry-run"]) == 2
    assert "--tp takes a positive number of GPUs" in capsys.readouterr().err
    assert ab.main(["--model", FULL, "--dry-run"]) == 2  # does not fit one GPU
    err = capsys.readouterr().err
    assert f"--model {FULL} needs --tp 2 or more" in err and "got --tp 1" in err


def test_tp_two_gpu_run_is_one_command(capsys):
    """``python -m eval.ab --model qwen3-next-80b-a3b --tp 2``: every server of the plan runs the full-size
    geometry with ``--tp-size 2`` (dummy load format, scaled random weights, as every built-in geometry)."""
    assert ab.main(["--model", FULL, "--tp", "2", "--arms", "stock,staged", "--batch", "1,64", "--dry-run"]) == 0
    out = capsys.readouterr().out
    servers = [line for line in out.splitlines() if " -m sglang.launch_server " in line
               or " -m sglang_replayssm.launch_server " in line]
    assert len(servers) == 2
    for line in servers:
        assert "--tp-size 2" in line and f"replayssm-ab-{FULL}-" in line and "--load-format dummy" in line
    assert "REPLAYSSM_EVAL_RANDOM_WEIGHTS=1" in out


def test_tp_end_to_end_with_stand_in_servers(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_REPLAYSSM_", "REPLAYSSM_EVAL_"))}
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "eval.ab", "--model", "tiny-nemotron-h", "--tp", "2", "--stock-module", FAKE,
           "--patched-module", FAKE, "--arms", "stock,patched", "--no-bench", "--parity-tokens", "16",
           "--parity-prompts", "2", "--out-dir", str(tmp_path), "--no-progress", "--shutdown-grace", "5"]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "ab-tiny-nemotron-h-tp2-stock-vs-patched.json").read_text())
    assert res["tp_size"] == 2 and res["flags"]["harness"]["tp"] == 2
    for label, arm in res["arms"].items():
        c = arm["command"]
        c = shlex.split(c) if isinstance(c, str) else c
        assert arm["status"] == "ok" and c[c.index("--tp-size") + 1] == "2", label
    assert not list(tmp_path.glob("ab-tiny-nemotron-h-stock-vs-*.json"))  # no single-GPU name


# --------------------------------------------------------------------------------------
# the full-size Qwen3-Next-80B geometry
# --------------------------------------------------------------------------------------

def _expert_params(cfg):
    """Routed-expert weights: layers x experts x (gate, up, down) x hidden x expert width."""
    return cfg["num_hidden_layers"] * cfg["num_experts"] * 3 * cfg["hidden_size"] * cfg["moe_intermediate_size"]


def test_tp_full_size_qwen3_next_80b_has_all_512_experts():
    full, e64 = models.get(FULL), models.get("qwen3-next-80b-a3b-e64")
    assert full.config["num_experts"] == 512 and e64.config["num_experts"] == 64
    assert {k: v for k, v in full.config.items() if k != "num_experts"} == \
        {k: v for k, v in e64.config.items() if k != "num_experts"}  # the same shapes otherwise
    assert models.layer_counts(full.config) == {"gdn": 36, "attention": 12}
    assert 76e9 < _expert_params(full.config) < 80e9 and _expert_params(full.config) == 8 * _expert_params(e64.config)
    assert full.min_tp == 2 and e64.min_tp == 1 and full.size == "real" and full.family == "gdn"
    assert "512" in full.source and full.spec_keys == e64.spec_keys


def test_tp_full_size_qwen3_next_80b_per_rank_heads_in_sglang():
    """SGLang's own Qwen3NextConfig loads the geometry; at TP=2 its mamba cache holds 16 of the 32 value
    heads per rank (8 of 16 key heads), the shard the two-GPU run's rings get."""
    from sglang.srt.configs import Qwen3NextConfig
    from sglang.srt.runtime_context import get_parallel

    cfg = models.get(FULL).config_json(spec=True)
    c = Qwen3NextConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype")})
    assert c.num_experts == 512 and c.num_nextn_predict_layers == 1
    for tp, (hk, hv) in ((1, (16, 32)), (2, (8, 16))):
        with get_parallel().override(attn_tp_size=tp):
            shape = c.mamba2_cache_params.shape
        assert tuple(shape.temporal) == (hv, 128, 128) and shape.num_k_heads_per_tp == hk, tp
