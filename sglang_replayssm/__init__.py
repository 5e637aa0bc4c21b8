"""sglang_replayssm: ReplaySSM decoding for hybrid models in stock SGLang (fork-free patch package)."""

__version__ = "0.1.0"
