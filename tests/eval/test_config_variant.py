"""eval/config_variant.py: a launch variant carries the whole base file with only its own entries changed."""
from pathlib import Path

import pytest
import yaml

from eval import config_variant

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "sglang_replayssm" / "kernels" / "configs" / "h200.yaml"


def test_variant_changes_only_what_it_names(tmp_path):
    out = tmp_path / "v.yaml"
    change = ("mamba2_output_only: {default: {state_first: 0}}\n"
              "gdn_decode: {HV32_HK16_K128_V128_L16: {BV: 32}, HV32_HK16_K128_V128_L16_Sbf16: {BV: 64}}")
    assert config_variant.main(["--base", str(H200), "--out", str(out), change]) == 0
    base, var = yaml.safe_load(H200.read_text()), yaml.safe_load(out.read_text())
    assert var["mamba2_output_only"]["default"] == {"state_first": 0}  # a family the base leaves at the code's
    assert var["gdn_decode"]["HV32_HK16_K128_V128_L16"] == {"BV": 32}  # a new geometry key
    assert var["gdn_decode"]["HV32_HK16_K128_V128_L16_Sbf16"] == {**base["gdn_decode"][
        "HV32_HK16_K128_V128_L16_Sbf16"], "BV": 64}  # an existing entry changed parameter by parameter
    for key in set(base["gdn_decode"]) - {"HV32_HK16_K128_V128_L16_Sbf16"}:
        assert var["gdn_decode"][key] == base["gdn_decode"][key]
    for fam in set(base) - {"mamba2_output_only", "gdn_decode"}:
        assert var[fam] == base[fam]
    # the kernels accept the result (every parameter known to its family)
    from sglang_replayssm.kernels import common

    cfg = common.launch_config("mamba2_output_only", ["H128_P64_N128_G8_L16"], path=str(out))
    assert cfg["state_first"] == 0
    assert cfg["inline_bc_max_batch"] == common.family_defaults("mamba2_output_only")["inline_bc_max_batch"]


@pytest.mark.parametrize("bad", ["[1, 2]", "mamba2_output_only: {default: 3}", "a: [b",
                                 "mamba2_output_only: {default: {state_frist: 1}}", "gdn_decode: {default: {BV: 24}}",
                                 "mamba2_state_and_output: {default: {BLOCK_M: 32}}"])
def test_bad_variant_is_refused(tmp_path, capsys, bad):
    with pytest.raises(SystemExit):
        config_variant.main(["--base", str(H200), "--out", str(tmp_path / "v.yaml"), bad])
    assert "error" in capsys.readouterr().err and not (tmp_path / "v.yaml").exists()


def test_gpu_without_its_own_file_starts_from_nothing(tmp_path, monkeypatch):
    """On a GPU with no packaged file (a B300: default.yaml and the built-in defaults alone) the variant holds only
    what it names, so it runs that GPU's packaged config with the change on top; a named --base must exist."""
    from sglang_replayssm.kernels import common

    monkeypatch.delenv(common.ENV_CONFIG_FILE, raising=False)
    monkeypatch.setattr(common, "gpu_key", lambda: "b300")
    assert not common.config_file().exists()
    out = tmp_path / "v.yaml"
    assert config_variant.main(["--out", str(out), "mamba2_verify: {default: {flush_stages: 3}}"]) == 0
    assert yaml.safe_load(out.read_text()) == {"mamba2_verify": {"default": {"flush_stages": 3}}}
    import torch

    cfg = common.launch_config("mamba2_verify", common.config_keys("H128_P64_N128_G8_R20_T4", torch.float32),
                               path=str(out))
    assert cfg["flush_stages"] == 3 and cfg["flush_split"] == 1  # default.yaml's fp32 entry still applies below
    with pytest.raises(SystemExit):
        config_variant.main(["--base", str(tmp_path / "none.yaml"), "--out", str(out), "{}"])
