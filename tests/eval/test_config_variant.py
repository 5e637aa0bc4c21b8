"""eval/config_variant.py: a launch variant carries the whole base file with only its own entries changed."""
from pathlib import Path

import pytest
import yaml

from eval import config_variant

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "sglang_replayssm" / "kernels" / "configs" / "h200.yaml"


def test_variant_changes_only_what_it_names(tmp_path):
    out = tmp_path / "v.yaml"
    change = "mamba2_output_only: {default: {state_first: 1}}\ngdn_decode: {HV32_HK16_K128_V128_L16: {BV: 32}}"
    assert config_variant.main(["--base", str(H200), "--out", str(out), change]) == 0
    base, var = yaml.safe_load(H200.read_text()), yaml.safe_load(out.read_text())
    assert var["mamba2_output_only"]["default"] == {**base["mamba2_output_only"]["default"], "state_first": 1}
    assert var["gdn_decode"]["HV32_HK16_K128_V128_L16"] == {"BV": 32}  # a new geometry key
    assert var["gdn_decode"]["default"] == base["gdn_decode"]["default"]
    for fam in set(base) - {"mamba2_output_only", "gdn_decode"}:
        assert var[fam] == base[fam]
    # the kernels accept the result (every parameter known to its family)
    from sglang_replayssm.kernels import common, mamba2_replay

    cfg = common.launch_config("mamba2_output_only", ["H128_P64_N128_G8_L16"],
                               mamba2_replay.LAUNCH_DEFAULTS["mamba2_output_only"], path=str(out))
    assert cfg["state_first"] == 1 and cfg["inline_bc_max_batch"] == base["mamba2_output_only"]["default"][
        "inline_bc_max_batch"]


@pytest.mark.parametrize("bad", ["[1, 2]", "mamba2_output_only: {default: 3}", "a: [b"])
def test_bad_variant_is_refused(tmp_path, capsys, bad):
    with pytest.raises(SystemExit):
        config_variant.main(["--base", str(H200), "--out", str(tmp_path / "v.yaml"), bad])
    assert "error" in capsys.readouterr().err and not (tmp_path / "v.yaml").exists()
