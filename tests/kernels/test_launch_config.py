"""Launch configs: the configurations resolved for the H200 (pinned), the built-in defaults a GPU without its own
file runs, and ``common.validate_config_file`` / ``common.launch_config`` on bad files.

No kernel runs here: these are configuration facts (CPU only, fast).
"""

from __future__ import annotations

import re

import pytest
import torch

from sglang_replayssm.kernels import common, gdn_replay, gdn_verify, mamba2_replay, mamba2_verify  # noqa: F401

H200 = common.CONFIG_DIR / "h200.yaml"
DEFAULT = common.CONFIG_DIR / "default.yaml"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# ----------------------------------------------------------------------------------
# the launch configs the H200 resolves, pinned: written down from the code and h200.yaml of 013a91c (before the
# losing options were removed and the winners became the built-in defaults), less the removed parameters
# (prefetch 0, l2_hints 0, v_tiles 1 everywhere). Batch 1 against larger batches is in the inline_* entries.
# ----------------------------------------------------------------------------------
GDN_WHOLE_TILE = {"BKC": 0, "BV": 16, "cast": "bits", "dot_precision": "tf32x3", "flush": "rank1",
                  "flush_first_max_batch": 0, "inline_BKC": -1, "inline_BV": 0, "inline_num_warps": 0, "inline_scores_max_batch": 1, "maxnreg": 0, "num_stages": 1,
                  "num_warps": 1, "scores": "pre", "scores_num_warps": 1, "pdl": 0,
                  "pdl_wait": "start"}
GDN_BF16 = dict(GDN_WHOLE_TILE, BV=32, cast="cvt", inline_BV=16, flush_first_max_batch=512)
GDN_KCHUNK = dict(GDN_WHOLE_TILE, BKC=32, BV=32, flush="dot", inline_BKC=0, inline_BV=16, inline_num_warps=2,
                  flush_first_max_batch=512)
GDN_VERIFY = {"BV": 16, "dot_precision": "tf32x3", "flush": "rank1", "inline_scores_max_batch": 1, "maxnreg": 168,
              "num_stages": 1, "num_warps": 1, "reduce": "token", "scores": "pre", "scores_num_warps": 1,
              "v_loop": 8, "v_stages": 3, "k_parts": 2, "v_loop_min_batch": 64, "v_loop_max_window": 4,
              "v_loop_maxnreg": 0, "window_dot": "split", "flush_rows": "fused", "flush_v_stages": 0, "pdl": 0}
MAMBA2 = {"BLOCK_M": 32, "BLOCK_NC": 64, "bc_num_warps": 2, "dot_precision": "tf32x3", "flush_first_max_batch": 0, "flush_unroll": 1,
          "inline_bc_max_batch": 1, "inline_maxnreg": -1, "maxnreg": 0, "num_stages": 1, "num_warps": 1,
          "state_first": 1, "pdl": 0}
# register caps above batch 1 for the Nemotron-H geometries (kernel-variants-h200/regcap); flush rows first
# (kernel-variants-h200/mixed-order)
MAMBA2_FP32 = dict(MAMBA2, BLOCK_NC=32, flush_unroll=0, maxnreg=168, inline_maxnreg=0, flush_first_max_batch=64)
MAMBA2_BF16 = dict(MAMBA2, BLOCK_NC=32, flush_unroll=0, maxnreg=128, inline_maxnreg=0, flush_first_max_batch=512)
MAMBA2_VERIFY = {"BLOCK_M": 32, "BLOCK_NC": 32, "bc": "pre", "bc_num_warps": 1, "dot_precision": "tf32x3",
                 "inline_bc_max_batch": 1, "maxnreg": 0, "nonflush": "stream", "num_stages": 1, "num_warps": 1,
                 "reduce": "token", "stream_chunk": 16, "flush_stages": 2, "flush_split": 0, "pdl": 0}

GDN_GEOMS = ["HV32_HK16_K128_V128", "HV64_HK16_K128_V128", "HV16_HK16_K128_V128", "HV4_HK2_K32_V32"]
MAMBA2_GEOMS = ["H128_P64_N128_G8", "H256_P64_N128_G8", "H4_P16_N16_G2"]
# default.yaml's default_Sfp32: an fp32 state's GDN verify window dots on the CUDA cores and its flush rows in a
# launch of their own, every geometry
GDN_VERIFY_FP32 = dict(GDN_VERIFY, window_dot="fma", flush_rows="separate", flush_v_stages=2)
# its default_Sbf16 / default_Sfp16: a 16-bit state's Mamba2 verify non-flush dots on the tensor cores
MAMBA2_VERIFY_16 = dict(MAMBA2_VERIFY, nonflush="mma")
# its default_Sfp32: an fp32 state's flush fold in two tf32 passes (spec-variants-h200, round 13) and three flush-loop
# stages (round 17)
MAMBA2_VERIFY_FP32 = dict(MAMBA2_VERIFY, flush_split=1, flush_stages=3)


def _default_yaml_entry(family, tag):
    """What default.yaml resolves for every geometry of a family and state dtype."""
    if family == "gdn_verify":
        return GDN_VERIFY_FP32 if tag == "fp32" else GDN_VERIFY
    if family == "mamba2_verify":
        return MAMBA2_VERIFY_FP32 if tag == "fp32" else MAMBA2_VERIFY_16
    return common.family_defaults(family)


def _h200_expected():
    exp = {}
    for tag in DTYPES:
        for g in GDN_GEOMS:
            qwen = g in ("HV32_HK16_K128_V128", "HV64_HK16_K128_V128")  # Qwen3-Next, Qwen3.5-122B
            exp[("gdn_decode", f"{g}_L16", tag)] = (GDN_KCHUNK if qwen and tag == "fp32" else
                                                    GDN_BF16 if qwen and tag == "bf16" else GDN_WHOLE_TILE)
            verify = _default_yaml_entry("gdn_verify", tag)
            exp[("gdn_verify", f"{g}_R20_T4", tag)] = verify
            # 8-node trees on the Qwen3-Next geometry run uncapped (spec-variants-h200/tree-t8); elsewhere the cap
            exp[("gdn_verify", f"{g}_R24_T8", tag)] = dict(verify, maxnreg=0) \
                if g == "HV32_HK16_K128_V128" and tag == "fp32" else verify
        for g in MAMBA2_GEOMS:  # Nemotron-H-8B, the large Nemotron-H, a tiny one
            nemotron = g != "H4_P16_N16_G2"
            exp[("mamba2_output_only", f"{g}_L16", tag)] = (MAMBA2_FP32 if nemotron and tag == "fp32" else
                                                           MAMBA2_BF16 if nemotron and tag == "bf16" else MAMBA2)
            exp[("mamba2_verify", f"{g}_R20_T4", tag)] = _default_yaml_entry("mamba2_verify", tag)
    return exp


H200_EXPECTED = _h200_expected()


@pytest.mark.parametrize("family,key,tag", list(H200_EXPECTED), ids=["-".join(k) for k in H200_EXPECTED])
def test_h200_resolved_configs_are_pinned(family, key, tag):
    got = common.launch_config(family, common.config_keys(key, DTYPES[tag]), path=str(H200))
    assert got == H200_EXPECTED[(family, key, tag)]


def test_the_wrappers_resolve_the_pinned_h200_configs(monkeypatch):
    """The kernel wrappers' own lookups (their geometry keys and state-dtype keys) land on the pinned entries."""
    monkeypatch.setenv(common.ENV_CONFIG_FILE, str(H200))
    assert gdn_replay.gdn_launch_params(32, 16, 128, 128, 16, torch.float32) == GDN_KCHUNK
    assert gdn_replay.gdn_launch_params(64, 16, 128, 128, 16, torch.bfloat16) == GDN_BF16
    assert gdn_replay.gdn_launch_params(32, 16, 128, 128, 16, torch.float16) == GDN_WHOLE_TILE
    assert gdn_verify.gdn_verify_launch_params(32, 16, 128, 128, 20, 4, torch.float32) == GDN_VERIFY_FP32
    assert gdn_verify.gdn_verify_launch_params(32, 16, 128, 128, 24, 8, torch.float32) == dict(GDN_VERIFY_FP32,
                                                                                               maxnreg=0)
    assert gdn_verify.gdn_verify_launch_params(32, 16, 128, 128, 24, 8, torch.bfloat16) == GDN_VERIFY  # untimed
    keys = common.config_keys(mamba2_replay.geometry_key(128, 64, 128, 8, 16), torch.bfloat16)
    assert common.launch_config("mamba2_output_only", keys) == MAMBA2_BF16


def test_the_built_in_defaults_are_the_h200_winners():
    """A GPU without its own file (default.yaml only) runs what the H200 runs wherever h200.yaml has no
    geometry entry: the fast configs, not the earlier slow fallbacks."""
    assert common.family_defaults("gdn_decode") == GDN_WHOLE_TILE
    assert common.family_defaults("gdn_verify") == GDN_VERIFY
    assert common.family_defaults("mamba2_output_only") == MAMBA2
    assert common.family_defaults("mamba2_verify") == MAMBA2_VERIFY
    for (family, key, tag), want in H200_EXPECTED.items():
        got = common.launch_config(family, common.config_keys(key, DTYPES[tag]), path=str(DEFAULT))
        assert got == _default_yaml_entry(family, tag)
        if want != got:  # only the H200's own geometry entries differ
            assert (family == "gdn_decode" and key.startswith(("HV32_HK16", "HV64_HK16")) and tag in ("fp32", "bf16")) \
                or (family == "gdn_verify" and key == "HV32_HK16_K128_V128_R24_T8") \
                or (family == "mamba2_output_only" and key.startswith(("H128_P64", "H256_P64")) and tag in ("fp32", "bf16"))


def test_h200_file_holds_only_geometry_entries():
    import yaml

    doc = yaml.safe_load(H200.read_text())
    assert set(doc) == {"gdn_decode", "gdn_verify", "mamba2_output_only"}
    assert all("default" not in entries for entries in doc.values())
    assert yaml.safe_load(DEFAULT.read_text()) == {
        "gdn_verify": {"default_Sfp32": {"window_dot": "fma", "flush_rows": "separate", "flush_v_stages": 2}},
        "mamba2_verify": {"default_Sbf16": {"nonflush": "mma"}, "default_Sfp16": {"nonflush": "mma"},
                          "default_Sfp32": {"flush_split": 1, "flush_stages": 3}}}


def test_h100_file_adds_its_measured_options_only(monkeypatch):
    """configs/h100.yaml holds what was measured on an H100 alone (round 16: four flush-loop stages for an fp32
    Mamba2 verify; round 18: pdl in the decode families and the GDN verify; round 19: the GDN decode's late pdl
    wait, the H200 file's bf16 GDN decode tile and Mamba2 decode caps); everything else resolves as on a GPU without
    a file."""
    monkeypatch.delenv(common.ENV_CONFIG_FILE, raising=False)
    monkeypatch.setattr(common, "gpu_key", lambda: "h100")
    assert common.config_file() == common.CONFIG_DIR / "h100.yaml"
    common.validate_config_file(common.config_file())
    key = "H128_P64_N128_G8_R20_T4"
    assert common.launch_config("mamba2_verify", common.config_keys(key, torch.float32)) == dict(
        MAMBA2_VERIFY_FP32, flush_stages=4)
    assert common.launch_config("mamba2_verify", common.config_keys(key, torch.bfloat16)) == MAMBA2_VERIFY_16
    assert common.launch_config("gdn_verify", common.config_keys("HV32_HK16_K128_V128_R20_T4", torch.float32)) == \
        dict(GDN_VERIFY_FP32, pdl=1)
    assert common.launch_config("gdn_decode", common.config_keys("HV32_HK16_K128_V128_L16", torch.float32)) == \
        dict(GDN_WHOLE_TILE, pdl=1, pdl_wait="scores", flush_first_max_batch=64)
    assert common.launch_config("gdn_decode", common.config_keys("HV32_HK16_K128_V128_L16", torch.bfloat16)) == \
        dict(GDN_WHOLE_TILE, pdl=1, pdl_wait="scores", cast="cvt", BV=32, inline_BV=16, flush_first_max_batch=512)
    for dt, cap in ((torch.float32, 168), (torch.bfloat16, 128)):
        assert common.launch_config("mamba2_output_only", common.config_keys("H128_P64_N128_G8_L16", dt)) == dict(
            MAMBA2, pdl=1, BLOCK_NC=32, flush_unroll=0, maxnreg=cap, inline_maxnreg=0, flush_first_max_batch=64)
    assert common.launch_config("mamba2_output_only", common.config_keys("H128_P64_N128_G8_L16", torch.float16)) \
        == dict(MAMBA2, pdl=1)


def test_h100_decode_entries_cover_the_h200_files_geometries():
    """Every decode geometry entry of h200.yaml that h100.yaml takes over (the bf16 GDN tile, the Mamba2 caps) is
    there for the same geometries, TP shards included, with the same tile parameters."""
    import yaml

    h200 = yaml.safe_load(H200.read_text())
    h100 = yaml.safe_load((common.CONFIG_DIR / "h100.yaml").read_text())
    took = {"gdn_decode": [k for k in h200["gdn_decode"] if k.endswith("_Sbf16")],
            "mamba2_output_only": list(h200["mamba2_output_only"])}
    for fam, keys in took.items():
        assert keys and set(keys) <= set(h100[fam])
        for k in keys:
            want = dict(h200[fam][k])
            if fam == "mamba2_output_only":
                want["flush_first_max_batch"] = 64  # flush rows first past batch 64 lost on the H100
            assert h100[fam][k] == want, k
    # the K-chunked tile lost on the H100: its fp32 entries set the flush-first bound alone
    fp32 = {k: v for k, v in h100["gdn_decode"].items() if k.endswith("_Sfp32")}
    assert set(fp32) == {k for k in h200["gdn_decode"] if k.endswith("_Sfp32")}
    assert all(v == {"flush_first_max_batch": 64} for v in fp32.values())


def test_a_gpu_without_a_file_falls_back_to_the_defaults(monkeypatch):
    monkeypatch.delenv(common.ENV_CONFIG_FILE, raising=False)
    monkeypatch.setattr(common, "gpu_key", lambda: "b300")
    assert not common.config_file().exists()
    assert common.launch_config("gdn_verify", "HV32_HK16_K128_V128_R20_T4") == GDN_VERIFY


# ----------------------------------------------------------------------------------
# validate_config_file
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [DEFAULT, H200], ids=["default", "h200"])
def test_packaged_files_validate_clean(path):
    assert common.validate_config_file(path) is None
    assert common.validate_config_file(str(path)) is None


def _write(tmp_path, text, name="cfg.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_missing_file(tmp_path):
    p = tmp_path / "nope.yaml"
    with pytest.raises(ValueError, match=rf"launch-config file {re.escape(str(p))} does not exist"):
        common.validate_config_file(p)


@pytest.mark.parametrize("text,match", [
    ("gdn_decode: {default: {BV: 16}\n", "not valid YAML"),
    ("- gdn_decode\n- mamba2_verify\n", "must hold a mapping of kernel families, got list"),
    ("just a string\n", "must hold a mapping of kernel families, got str"),
], ids=["malformed", "list", "scalar"])
def test_malformed_files(tmp_path, text, match):
    p = _write(tmp_path, text)
    with pytest.raises(ValueError, match=match) as e:
        common.validate_config_file(p)
    assert str(p) in str(e.value)


@pytest.mark.parametrize("text,match", [
    # sections
    ("gdn_decod:\n  default: {BV: 16}\n",
     r"unknown section \[gdn_decod\] \(did you mean 'gdn_decode'\?\); known kernel families: "
     r"\['conv1d_verify', 'gdn_decode', 'gdn_verify', 'mamba2_output_only', "
     r"'mamba2_verify'\]"),
    ("mamba2_route:\n  default: {route: output_only}\n", r"unknown section \[mamba2_route\]"),
    ("mamba2_state_and_output:\n  default: {BLOCK_M: 32}\n", r"unknown section \[mamba2_state_and_output\]"),
    ("gdn_verify: [BV, 16]\n", r"\[gdn_verify\]: must map \"default\" / geometry keys to entries, got list"),
    ("gdn_verify:\n  default: 16\n", r"\[gdn_verify\]\[default\]: an entry must be a mapping of launch parameters, "
                                     r"got int"),
    ("gdn_verify:\n  16: {BV: 16}\n", r"\[gdn_verify\]\[16\]: an entry key must be"),
    # parameters
    ("mamba2_output_only:\n  H128_P64_N128_G8_L16: {BLOCKM: 32}\n",
     r"\[mamba2_output_only\]\[H128_P64_N128_G8_L16\]: unknown parameter 'BLOCKM' \(did you mean 'BLOCK_M'\?\); "
     r"accepted: \["),
    ("gdn_decode:\n  default: {prefetch: 1}\n", r"unknown parameter 'prefetch'"),
    ("gdn_decode:\n  default: {l2_hints: 3}\n", r"unknown parameter 'l2_hints'"),
    ("gdn_decode:\n  default: {v_tiles: 2}\n", r"unknown parameter 'v_tiles'"),
    # timed on the H200, lost and removed (eval/results/kernel-variants-h200/regcap/, round 3)
    ("gdn_decode:\n  HV32_HK16_K128_V128_L16_Sfp32: {BKC: 32, flush_prefetch: 1}\n",
     r"\[gdn_decode\]\[HV32_HK16_K128_V128_L16_Sfp32\]: unknown parameter 'flush_prefetch'; accepted: \["),
    ("mamba2_output_only:\n  H128_P64_N128_G8_L16_Sfp32: {flush_unroll: 0, flush_prefetch: 1}\n",
     r"\[mamba2_output_only\]\[H128_P64_N128_G8_L16_Sfp32\]: unknown parameter 'flush_prefetch'; accepted: \["),
    # timed on the H100, lost and removed (eval/results/spec-variants-h200/round16/): the L2 prefetch of a later
    # program's blocks, in all four kernel families
    ("mamba2_verify:\n  default: {l2_prefetch: 512}\n", r"\[mamba2_verify\]\[default\]: unknown parameter 'l2_prefetch'"),
    ("gdn_verify:\n  default: {l2_prefetch: 256}\n", r"\[gdn_verify\]\[default\]: unknown parameter 'l2_prefetch'"),
    ("mamba2_output_only:\n  default: {l2_prefetch: 512}\n",
     r"\[mamba2_output_only\]\[default\]: unknown parameter 'l2_prefetch'"),
    ("gdn_decode:\n  default: {l2_prefetch: 512}\n", r"\[gdn_decode\]\[default\]: unknown parameter 'l2_prefetch'"),
    # timed on the H100, a wash in grid order and lost with flush rows first, removed (spec-variants-h200/, round
    # 19); the GDN decode's stays
    ("mamba2_output_only:\n  default: {pdl: 1, pdl_wait: scores}\n",
     r"\[mamba2_output_only\]\[default\]: unknown parameter 'pdl_wait'"),
    # timed on the H200, lost and removed (eval/results/kernel-variants-h200/m2-split-c7faaaa/); the verify's stays
    ("mamba2_output_only:\n  default: {flush_split: 1}\n",
     r"\[mamba2_output_only\]\[default\]: unknown parameter 'flush_split'"),
    # values
    ("gdn_decode:\n  default: {BV: 24}\n", r"\[gdn_decode\]\[default\]: BV must be a power of two >= 1, got 24"),
    ("gdn_decode:\n  default: {BV: -16}\n", r"BV must be a power of two >= 1, got -16"),
    ("gdn_decode:\n  default: {BV: 16.0}\n", r"BV must be a power of two >= 1, got 16.0"),
    ("gdn_decode:\n  default: {BV: '16'}\n", r"BV must be a power of two >= 1, got '16'"),
    ("gdn_decode:\n  default: {BV: true}\n", r"BV must be a power of two >= 1, got True"),
    ("gdn_decode:\n  default: {BKC: 8}\n", r"BKC must be 0 or a power of two >= 16 \(0: the whole tile\), got 8"),
    ("gdn_decode:\n  default: {inline_BKC: 24}\n", r"inline_BKC must be -1, 0 or a power of two >= 16"),
    ("gdn_decode:\n  default: {inline_num_warps: 3}\n", r"inline_num_warps must be one of \(0, 1, 2, 4, 8, 16, 32\)"),
    ("gdn_decode:\n  default: {flush: rank1_fold}\n", r"flush must be one of \('rank1', 'dot'\), got 'rank1_fold'"),
    ("gdn_decode:\n  default: {cast: truncate}\n", r"cast must be one of \('bits', 'cvt'\)"),
    ("gdn_decode:\n  default: {dot_precision: tf32}\n", r"dot_precision must be one of \('tf32x3', 'ieee'\)"),
    ("gdn_decode:\n  default: {inline_scores_max_batch: -1}\n", r"inline_scores_max_batch must be an int >= 0"),
    ("gdn_verify:\n  default: {reduce: dot}\n", r"reduce must be one of \('bcast', 'token'\), got 'dot'"),
    ("gdn_verify:\n  default: {flush: split}\n", r"flush must be one of"),
    ("gdn_verify:\n  default: {num_warps: 3}\n", r"num_warps must be one of \(1, 2, 4, 8, 16, 32\), got 3"),
    ("gdn_verify:\n  default: {num_warps: 64}\n", r"num_warps must be one of"),
    ("gdn_verify:\n  default: {num_stages: 0}\n", r"num_stages must be an int >= 1"),
    ("gdn_verify:\n  default: {maxnreg: -8}\n", r"maxnreg must be 0 \(no cap\) or an int from 16 to 255, got -8"),
    ("gdn_verify:\n  default: {maxnreg: 300}\n", r"maxnreg must be 0 \(no cap\) or an int from 16 to 255"),
    ("mamba2_verify:\n  default: {maxnreg: 1.5}\n", r"maxnreg must be"),
    ("mamba2_verify:\n  default: {BLOCK_M: 8}\n", r"BLOCK_M must be a power of two >= 16, got 8"),
    ("mamba2_verify:\n  default: {nonflush: pipelined}\n", r"nonflush must be one of \('chunked', 'stream', 'mma'\)"),
    # timed on the H200: the winners built in, the options removed (eval/results/spec-variants-h200/README.md, round 15)
    ("gdn_verify:\n  default: {prologue: row}\n", r"\[gdn_verify\]\[default\]: unknown parameter 'prologue'"),
    ("gdn_verify:\n  default: {early_tile: 1}\n", r"\[gdn_verify\]\[default\]: unknown parameter 'early_tile'"),
    ("mamba2_verify:\n  default: {flush_dots: fold}\n",
     r"\[mamba2_verify\]\[default\]: unknown parameter 'flush_dots'"),
    ("mamba2_verify:\n  default: {prologue: chain}\n", r"\[mamba2_verify\]\[default\]: unknown parameter 'prologue'"),
    # timed on the H200, lost and removed (eval/results/spec-variants-h200/README.md, round 8)
    ("mamba2_verify:\n  default: {nonflush: pipe}\n", r"nonflush must be one of \('chunked', 'stream', 'mma'\)"),
    ("mamba2_verify:\n  default: {pipe_chunk: 16}\n", r"pipe_chunk"),
    ("mamba2_verify:\n  default: {flush_unroll: 1}\n", r"flush_unroll"),
    ("mamba2_verify:\n  default: {bc: post}\n", r"bc must be one of \('inline', 'pre'\)"),
    # timed on the H200, lost and removed (eval/results/spec-variants-h200/README.md, round 13)
    ("mamba2_verify:\n  default: {early_state: 1}\n", r"\[mamba2_verify\]\[default\]: unknown parameter 'early_state'"),
    # timed on the H200, lost and removed (eval/results/kernel-variants-h200/carry-c7faaaa/)
    ("gdn_decode:\n  default: {carry: 1}\n", r"\[gdn_decode\]\[default\]: unknown parameter 'carry'"),
    # timed on the H200, lost and removed (eval/results/conv-verify-h200.md)
    ("conv1d_verify:\n  default: {stores: rows}\n", r"\[conv1d_verify\]\[default\]: unknown parameter 'stores'"),
    # timed on the H200, lost and removed (eval/results/spec-variants-h200/README.md, round 6)
    ("gdn_decode:\n  default: {flush_first_max_batch: -1}\n", r"flush_first_max_batch must be an int >= 0, got -1"),
    ("mamba2_verify:\n  default: {reduce: dot}\n", r"reduce must be one of \('bcast', 'token'\), got 'dot'"),
    # one reduction over the whole row lost to chunks of 16 (spec-variants-h200/README.md, round 7): removed
    ("mamba2_verify:\n  default: {stream_chunk: 0}\n", r"stream_chunk must be a power of two >= 16, got 0"),
    ("mamba2_output_only:\n  default: {BLOCK_NC: 48}\n", r"BLOCK_NC must be a power of two >= 16, got 48"),
    ("mamba2_output_only:\n  default: {num_warps: 3}\n", r"num_warps must be one of"),
    ("mamba2_output_only:\n  default: {bc_num_warps: 0}\n", r"bc_num_warps must be one of"),
    ("mamba2_output_only:\n  default: {state_first: 2}\n", r"state_first must be 0 or 1 \(false / true\), got 2"),
    ("mamba2_output_only:\n  default: {inline_maxnreg: -2}\n",
     r"inline_maxnreg must be -1 \(as maxnreg\), 0 \(no cap\) or an int from 16 to 255, got -2"),
    ("mamba2_output_only:\n  default: {maxnreg: -1}\n", r"maxnreg must be 0 \(no cap\) or an int from 16 to 255, got -1"),
])
def test_bad_entries_are_refused_up_front(tmp_path, text, match):
    """Every kind of bad file content: one ValueError naming the file, section, entry key and parameter and what is
    accepted (a valid section before it: the whole file is read)."""
    p = _write(tmp_path, "# a comment\nmamba2_verify:\n  default: {reduce: token}\n" + text)
    with pytest.raises(ValueError, match=match) as e:
        common.validate_config_file(p)
    assert str(e.value).startswith(f"launch config {p}")


@pytest.mark.parametrize("family,key,body", [
    ("gdn_decode", "HV2_HK1_K32_V32_L4", "{BV: 24}"),
    ("gdn_verify", "HV2_HK1_K32_V32_R6_T2", "{reduce: dot}"),
    ("mamba2_output_only", "H4_P16_N16_G2_L4", "{num_warps: 3}"),
    ("mamba2_verify", "H4_P16_N16_G2_R6_T2", "{BLOCK_K: 16}"),
])
def test_launch_config_and_validate_share_the_checks(tmp_path, family, key, body):
    p = _write(tmp_path, f"{family}:\n  {key}: {body}\n")
    with pytest.raises(ValueError) as v:
        common.validate_config_file(p)
    with pytest.raises(ValueError) as lc:
        common.launch_config(family, key, path=str(p))
    assert str(v.value) == str(lc.value) and f"[{family}][{key}]" in str(v.value)
    # an entry of another geometry is not read by a lookup, but validation finds it
    assert common.launch_config(family, key + "0", path=str(p)) == common.family_defaults(family)


def test_empty_sections_and_entries_are_fine(tmp_path):
    p = _write(tmp_path, "gdn_decode:\ngdn_verify:\n  default:\nmamba2_verify: {}\n")
    assert common.validate_config_file(p) is None


def test_explicit_missing_path_is_refused(tmp_path, monkeypatch):
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ValueError, match=rf"launch-config file {re.escape(str(missing))} does not exist"):
        common.launch_config("gdn_verify", "HV32_HK16_K128_V128_R20_T4", path=str(missing))
    monkeypatch.setenv(common.ENV_CONFIG_FILE, str(missing))
    with pytest.raises(ValueError, match="does not exist"):
        common.launch_config("gdn_verify", "HV32_HK16_K128_V128_R20_T4")
    with pytest.raises(ValueError, match="does not exist"):
        gdn_verify.gdn_verify_launch_params(2, 1, 32, 32, 6, 2)


def test_unknown_family_in_a_lookup():
    with pytest.raises(ValueError, match=r"unknown kernel family 'gdn_decod' \(did you mean 'gdn_decode'\?\)"):
        common.launch_config("gdn_decod", "HV32_HK16_K128_V128_L16")


@pytest.mark.parametrize("tp_key,tp1_key", [("HV16_HK8", "HV32_HK16"), ("HV8_HK4", "HV32_HK16"),
                                            ("HV32_HK8", "HV64_HK16"), ("HV16_HK4", "HV64_HK16")])
@pytest.mark.parametrize("tag", ["fp32", "bf16"])
def test_h200_tp_rank_keys_take_the_tp1_entries(tp_key, tp1_key, tag):
    """Under tensor parallelism a rank's GDN key has HV/TP, Hk/TP heads: it resolves to its TP = 1 entry."""
    def resolve(k):
        return common.launch_config("gdn_decode", common.config_keys(f"{k}_K128_V128_L16", DTYPES[tag]), path=str(H200))

    assert resolve(tp_key) == resolve(tp1_key) != common.launch_config("gdn_decode", "none", path=str(H200))


@pytest.mark.parametrize("tp_key,tp1_key", [("H64_P64_N128_G4", "H128_P64_N128_G8"),
                                            ("H32_P64_N128_G2", "H128_P64_N128_G8"),
                                            ("H128_P64_N128_G4", "H256_P64_N128_G8"),
                                            ("H64_P64_N128_G2", "H256_P64_N128_G8")])
@pytest.mark.parametrize("tag", ["fp32", "bf16"])
def test_h200_mamba2_tp_rank_keys_take_the_tp1_entries(tp_key, tp1_key, tag):
    """Under tensor parallelism a rank's Mamba2 key has H/TP heads and G/TP groups (tests/patches/test_tp_sharding.py):
    at TP 2 and 4 it resolves to its TP = 1 entry (the register-capped one)."""
    def resolve(k):
        return common.launch_config("mamba2_output_only", common.config_keys(f"{k}_L16", DTYPES[tag]), path=str(H200))

    assert resolve(tp_key) == resolve(tp1_key) == (MAMBA2_FP32 if tag == "fp32" else MAMBA2_BF16)


def test_register_cap_small_batches(monkeypatch):
    """``inline_maxnreg`` caps the launches of a family's small batches (-1: as ``maxnreg``; 0: none); the
    other launches keep ``maxnreg``; the interpreter never takes a cap."""
    cfg = {"maxnreg": 168, "inline_maxnreg": 0}
    monkeypatch.setattr(common, "interpreting", lambda: True)
    assert common.register_cap(cfg) == {} and common.register_cap(cfg, small=True) == {}
    monkeypatch.setattr(common, "interpreting", lambda: False)
    assert common.register_cap(cfg) == {"maxnreg": 168}
    assert common.register_cap(cfg, small=True) == {}
    assert common.register_cap(dict(cfg, inline_maxnreg=-1), small=True) == {"maxnreg": 168}
    assert common.register_cap(dict(cfg, inline_maxnreg=96), small=True) == {"maxnreg": 96}
    assert common.register_cap({"maxnreg": 128}, small=True) == {"maxnreg": 128}  # a family without the option


def test_mamba2_decode_small_batch_register_cap(tmp_path, monkeypatch):
    """The Mamba2 decode kernel is launched with ``maxnreg`` above ``inline_bc_max_batch`` and with
    ``inline_maxnreg`` within it (the recorded launch options; nothing is run)."""
    from sglang_replayssm.kernels import mamba2_replay as mr

    monkeypatch.setenv(common.ENV_CONFIG_FILE, str(_write(
        tmp_path, "mamba2_output_only:\n  default: {maxnreg: 168, inline_maxnreg: 0, inline_bc_max_batch: 1}\n")))
    monkeypatch.setattr(common, "interpreting", lambda: False)
    seen = []
    monkeypatch.setattr(mr, "_mamba2_replay_kernel", type("K", (), {
        "__getitem__": lambda self, grid: (lambda *a, **kw: seen.append((grid[1], kw.get("maxnreg"))))})())
    monkeypatch.setattr(mr, "_mamba2_bc_kernel", type("K", (), {
        "__getitem__": lambda self, grid: (lambda *a, **kw: None)})())
    H, P, N, G, L, S = 4, 16, 16, 2, 4, 4
    for batch in (1, 3):
        mr.mamba2_replay_decode(torch.zeros(S, H, P, N), torch.zeros(S, H, L, P), torch.zeros(S, G, L, N),
                                torch.zeros(S, H, L), torch.zeros(batch, H, P), torch.zeros(batch, H),
                                -torch.ones(H), torch.zeros(batch, G, N), torch.zeros(batch, G, N),
                                torch.arange(1, batch + 1), torch.zeros(batch, dtype=torch.int32))
    assert seen == [(1, None), (3, 168)]



def test_dtype_wide_default_entry(tmp_path):
    """default_S<dtype> applies to every geometry of that state dtype: after the file's default, before a geometry
    key; the packaged default.yaml keeps an fp32 state's GDN verify window dots on the CUDA cores."""
    import torch

    from sglang_replayssm.kernels import gdn_verify as gv
    from sglang_replayssm.kernels.common import config_keys, launch_config

    assert config_keys("K1", torch.bfloat16) == ("K1_Sbf16", "K1", "default_Sbf16")
    assert config_keys("K1", None) == ("K1",)
    f = tmp_path / "gpu.yaml"
    f.write_text("gdn_verify:\n  default: {v_loop: 4}\n  default_Sbf16: {v_loop: 2, k_parts: 4}\n"
                 "  K1: {k_parts: 1}\n")
    bf16 = launch_config("gdn_verify", config_keys("K1", torch.bfloat16), path=str(f))
    fp32 = launch_config("gdn_verify", config_keys("K2", torch.float32), path=str(f))
    assert (bf16["v_loop"], bf16["k_parts"]) == (2, 1)  # default_Sbf16 over default; the geometry key over both
    assert (fp32["v_loop"], fp32["k_parts"]) == (4, gv.GDN_VERIFY_DEFAULT_LAUNCH["k_parts"])
    assert fp32["window_dot"] == "fma"  # default.yaml's default_Sfp32
    assert bf16["window_dot"] == gv.GDN_VERIFY_DEFAULT_LAUNCH["window_dot"] == "split"
