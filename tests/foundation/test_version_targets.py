"""Every patch target must exist, with the expected signature, in SGLang 0.5.15, 0.5.17 and 0.5.23."""

from pathlib import Path

import pytest

from sglang_wheels import wheel_for

from sglang_replayssm.patches import launch_check_patches
from sglang_replayssm.patches.registry import Patch
from sglang_replayssm.patches.source_check import check





@pytest.mark.parametrize("version", ["0.5.15", "0.5.23"])
def test_targets_exist_in_other_releases(version):
    problems = check(launch_check_patches(), wheel_for(version), version)
    assert problems == [], "\n".join(problems)


def test_installed_release_agrees_with_source_check():
    import sglang

    wheel_dir = Path(sglang.__file__).parent.parent
    # the installed 0.5.17 is checked by import in test_registry; here only that the checker
    # itself finds a known target and refuses a wrong one in another release's source
    w = wheel_for("0.5.23")
    good = launch_check_patches()[0]
    assert check([good], w, "0.5.23") == []
    wrong = Patch(good.target, "after", good.hook, params=("self", "nonexistent"))
    assert check([wrong], w, "0.5.23")
    missing = Patch("sglang.srt.server_args.ServerArgs.no_such_method", "after", good.hook)
    assert "not found" in check([missing], w, "0.5.23")[0]
    assert wheel_dir.exists()
