"""Offline API for ``sglang.Engine`` users.

    import sglang_replayssm
    sglang_replayssm.enable(buffer_len=16)
    engine = sglang.Engine(model_path=..., ...)

``enable`` validates the settings, exports them as ``SGLANG_REPLAYSSM_*`` (the Engine's
spawned scheduler processes inherit them and the plugin patches there) and patches this
process too. ``disable`` undoes both for engines created afterwards.
"""

from __future__ import annotations

import os

from .config import DEPRECATED_ENV, ENV_PREFIX, ReplaySSMConfig, deactivate, from_env


def enable(**settings) -> ReplaySSMConfig:
    """Validate ``settings``, export them and patch this process; raises (and leaves the environment as it
    was) when the patches could not reach SGLang's processes or would patch nothing."""
    from .launch_server import entry_point_registered, plugins_allowlist_problem
    from .plugin import activate, setup_logging

    cfg = from_env().replace(enable=True, **settings)
    if not entry_point_registered():
        raise RuntimeError("sglang_replayssm is not installed as a package (its sglang.srt.plugins entry point "
                           "is missing), so SGLang's spawned processes would run unpatched: pip install it first")
    problem = plugins_allowlist_problem()
    if problem:
        raise RuntimeError(f"sglang_replayssm.enable: {problem}")
    saved = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    for k in DEPRECATED_ENV:  # read into cfg; the Engine's processes get the new names only
        os.environ.pop(k, None)
    os.environ.update(cfg.to_env())
    setup_logging(cfg)
    try:
        activate(cfg)
    except BaseException:
        for k in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
            del os.environ[k]
        os.environ.update(saved)
        deactivate()  # the config in force is the restored environment's again
        raise
    return cfg


def disable() -> None:
    from .patches import unapply_all

    for k in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
        del os.environ[k]
    unapply_all()
    deactivate()  # the config in force is the (cleared) environment's again
