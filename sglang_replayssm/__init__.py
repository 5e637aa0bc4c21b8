"""sglang_replayssm: ReplaySSM decoding for hybrid models in stock SGLang (fork-free patch package)."""

__version__ = "0.1.0"

from .api import disable, enable  # noqa: E402,F401
from .config import ConfigError, ReplaySSMConfig  # noqa: E402,F401
