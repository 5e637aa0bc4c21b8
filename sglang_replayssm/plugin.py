"""SGLang plugin entry point (group ``sglang.srt.plugins``).

SGLang calls :func:`register` in every process it starts (the launcher, each spawned
scheduler, the detokenizer) through ``sglang.srt.plugins.load_plugins()``. It is inert
unless ``SGLANG_REPLAYSSM_ENABLE`` is true, so installing the package beside SGLang
changes nothing for plain ``python -m sglang.launch_server``.

SGLang logs and swallows plugin exceptions; a half-patched server would silently
compute with the wrong kernels, so a failure here exits the process instead.
"""

from __future__ import annotations

import logging
import os

from .config import ConfigError, ReplaySSMConfig, from_env

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
    seams unless ``staged`` is false); returns the newly patched targets."""
    from .patches import active_patches, apply, verify

    patches = active_patches(cfg.staged)
    if not cfg.staged:
        logger.info("sglang_replayssm: --replayssm-staged false: launch checks only; SGLang's own SSM kernels "
                    "and state pool serve every request")
    newly = apply(patches)
    verify(patches)
    # the launch-config file in force (kernels/common.config_file), named without querying the GPU here
    kernel_cfg = cfg.kernel_config or "the GPU's packaged file (kernels/configs/<gpu>.yaml)"
    logger.info("sglang_replayssm active (pid %d): L=%d, ssm_types=%s, spec=%s, staged=%s, kernel config %s, "
                "%d patch(es) verified", os.getpid(), cfg.buffer_len, ",".join(cfg.ssm_types), cfg.spec, cfg.staged,
                kernel_cfg, len(patches))
    return newly


def register() -> None:
    try:
        cfg = from_env()
    except ConfigError as e:
        raise SystemExit(f"sglang_replayssm: bad configuration: {e}") from None
    if not cfg.enable:
        logger.debug("sglang_replayssm installed but not enabled (SGLANG_REPLAYSSM_ENABLE unset): inert")
        return
    setup_logging(cfg)
    try:
        activate(cfg)
    except Exception as e:
        logger.critical("sglang_replayssm could not patch SGLang: %s", e)
        raise SystemExit(f"sglang_replayssm: refusing to run half-patched: {e}") from None
