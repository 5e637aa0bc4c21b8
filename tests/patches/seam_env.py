"""Shared setup of the seam tests: a process whose ReplaySSM settings are only what the test says."""

import os

from sglang_replayssm.config import reset_for_tests
from sglang_replayssm.patches import unapply_all


class ConfigEnv:
    """``monkeypatch`` whose ``setenv`` / ``delenv`` also drop the process's cached ReplaySSM config
    (``config.reset_for_tests``), so a seam called after the change sees it, as a new SGLang process would."""

    def __init__(self, monkeypatch):
        self._mp = monkeypatch

    def setenv(self, name, value, prepend=None):
        self._mp.setenv(name, value, prepend)
        reset_for_tests()

    def delenv(self, name, raising=True):
        self._mp.delenv(name, raising=raising)
        reset_for_tests()

    def __getattr__(self, name):  # setattr, undo, ... as monkeypatch's
        return getattr(self._mp, name)


def replayssm_env(monkeypatch, buffer_len: int) -> ConfigEnv:
    """Enabled with ring length ``buffer_len``, no other ``SGLANG_REPLAYSSM_*`` variable, no published ServerArgs,
    and no patch applied. Returns ``monkeypatch`` as a :class:`ConfigEnv` for the test's later changes."""
    from sglang.srt import runtime_context

    env = ConfigEnv(monkeypatch)
    for k in [k for k in os.environ if k.startswith("SGLANG_REPLAYSSM_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("SGLANG_REPLAYSSM_ENABLE", "1")
    env.setenv("SGLANG_REPLAYSSM_BUFFER_LEN", str(buffer_len))
    monkeypatch.setattr(runtime_context.get_context(), "_server_args", None)
    unapply_all()
    return env
