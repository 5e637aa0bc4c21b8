"""SGLang plugin entry point (group ``sglang.srt.plugins``).

SGLang calls :func:`register` in every process it starts (the launcher, each spawned
scheduler, the detokenizer) through ``sglang.srt.plugins.load_plugins()``. It is inert
unless ``SGLANG_REPLAYSSM_ENABLE`` is true, so installing the package beside SGLang
changes nothing for plain ``python -m sglang.launch_server``.

SGLang logs and swallows plugin exceptions; a half-patched server would silently
compute with the wrong kernels, so a failure here exits the process instead.

"Enabled" is decided from ``SGLANG_REPLAYSSM_ENABLE`` alone: set to anything but an
off value (unset, empty, 0, false, no, off) counts as enabled, so a typo such as
``ture`` fails loudly instead of serving stock SGLang. A bad setting in any other
``SGLANG_REPLAYSSM_*`` variable fails an enabled process and is one warning line in an
inert one (plain ``python -m sglang.launch_server`` must keep working).
"""

from __future__ import annotations

import logging
import os

from . import config
from .config import ENABLE_ENV, ConfigError, ReplaySSMConfig, enable_requested

logger = logging.getLogger("sglang_replayssm")


def setup_logging(cfg: ReplaySSMConfig) -> None:
    logger.setLevel(cfg.log_level.upper())
    if not logger.handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("[%(asctime)s replayssm pid=%(process)d] %(levelname)s %(message)s"))
        logger.addHandler(h)
        logger.propagate = False


def activate(cfg: ReplaySSMConfig) -> list:
    """Apply and verify this config's patches in this process (the launch checks, plus the replay-ring
    seams unless ``replay_ring`` is false) and make ``cfg`` the config in force; returns the newly patched targets."""
    from .patches import active_patches, apply, verify
    from .patches.registry import require_applicable

    patches = active_patches(cfg.replay_ring, cfg.conv_verify_on)
    todo = require_applicable(patches)  # SGLang missing or outside every patch's range: an error, never "OK"
    if cfg.kernel_config:  # plugin-only use (no launcher): a bad file fails here, not at the first kernel call
        from .launch_server import kernel_config_problem

        problem = kernel_config_problem(cfg.kernel_config)
        if problem:
            raise ValueError(problem)
    if not cfg.replay_ring:
        logger.info("sglang_replayssm: --replayssm-replay-ring false: launch checks only; SGLang's own SSM kernels "
                    "and state pool serve every request")
    newly = apply(patches)
    verify(patches)
    # the config in force from here on: the seams read it (config.current), the kernels their launch-config file
    config.activate(cfg)
    if cfg.replay_ring or cfg.conv_verify_on:
        from .kernels.common import activate_config_file

        activate_config_file(cfg.kernel_config)
    # the launch-config file in force (kernels/common.config_file), named without querying the GPU here
    kernel_cfg = cfg.kernel_config or "the GPU's packaged file (kernels/configs/<gpu>.yaml)"
    logger.info("sglang_replayssm active (pid %d): L=%d, ssm_types=%s, spec=%s, replay_ring=%s, conv_verify=%s, "
                "kernel config %s, %d patch(es) verified", os.getpid(), cfg.buffer_len, ",".join(cfg.ssm_types),
                cfg.spec, cfg.replay_ring, cfg.conv_verify_on, kernel_cfg, len(todo))
    return newly


def register() -> None:
    try:
        cfg = config.current()  # the launcher's activated config in its own process, else parsed once here
    except ConfigError as e:
        if not enable_requested(os.environ):
            logger.warning("sglang_replayssm: not enabled (%s unset/off), so ignoring a bad setting: %s",
                           ENABLE_ENV, e)
            return
        raise SystemExit(f"sglang_replayssm: bad configuration: {e}") from None
    if not cfg.enable:
        logger.debug("sglang_replayssm installed but not enabled (SGLANG_REPLAYSSM_ENABLE unset): inert")
        return
    setup_logging(cfg)
    try:
        activate(cfg)
    except Exception as e:
        logger.critical("sglang_replayssm could not patch SGLang: %s", e)
        raise SystemExit(f"sglang_replayssm: enabled but refusing to run (unpatched or half-patched): {e}") from None
