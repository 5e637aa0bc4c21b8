"""Shared setup of the seam tests: a process whose ReplaySSM settings are only what the test says."""

import os

from sglang_replayssm.patches import unapply_all


def replayssm_env(monkeypatch, buffer_len: int) -> None:
    """Enabled with ring length ``buffer_len``, no other ``SGLANG_REPLAYSSM_*`` variable, no published ServerArgs,
    and no patch applied."""
    from sglang.srt import runtime_context

    for k in [k for k in os.environ if k.startswith("SGLANG_REPLAYSSM_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("SGLANG_REPLAYSSM_ENABLE", "1")
    monkeypatch.setenv("SGLANG_REPLAYSSM_BUFFER_LEN", str(buffer_len))
    monkeypatch.setattr(runtime_context.get_context(), "_server_args", None)
    unapply_all()
