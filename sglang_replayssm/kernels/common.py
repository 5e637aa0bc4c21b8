"""Pieces shared by every ReplaySSM kernel family: Triton helpers and launch configs.

Pure math and plumbing: nothing here imports SGLang. Launch configs (block sizes,
warps, stages) live in one YAML file per GPU under ``kernels/configs/``; kernels ask
for them through :func:`launch_config` and fall back to the ``default`` section.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import torch
import triton
import triton.language as tl

SOFTPLUS_THRESHOLD = 20.0
L2NORM_EPS = 1e-6

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)   # state / activation dtypes
INDEX_DTYPES = (torch.int32, torch.int64)                       # slot ids and cursors
DOT_PRECISIONS = ("tf32x3", "ieee")                             # fp32 tl.dot modes that keep fp32 parity


def check_dot_precision(value: str, where: str) -> None:
    """Refuse any fp32 dot mode but tf32x3 / ieee (plain tf32 drifts ~1e-2 from fp32)."""
    if value not in DOT_PRECISIONS:
        raise ValueError(f"{where}: dot_precision must be one of {DOT_PRECISIONS} "
                         f"(plain tf32 drifts ~1e-2 from fp32), got {value!r}")

def check_choices(cfg: Dict[str, Any], choices: Dict[str, Tuple[str, ...]], where: str) -> None:
    """Refuse a launch-config entry whose value is not one of its mode names."""
    for name, modes in choices.items():
        if cfg[name] not in modes:
            raise ValueError(f"{where}: {name} must be one of {modes}, got {cfg[name]!r}")


def check_index_vectors(fn: str, tensors: Dict[str, Any], contiguous: Tuple[str, ...] = ()) -> None:
    """Refuse slot / cursor arguments that are not 1-D int32/int64 tensors on the first one's device, or (for
    the names in ``contiguous``: per-slot cursor tensors) not contiguous."""
    ref_name, ref = next(iter(tensors.items()))
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in INDEX_DTYPES:
            raise ValueError(f"{fn}: {name} must be int32 or int64, got {t.dtype}")
        if t.dim() != 1:
            raise ValueError(f"{fn}: {name} must be 1-D, got shape {tuple(t.shape)}")
        if t.device != ref.device:
            raise ValueError(f"{fn}: {name} is on {t.device} but {ref_name} is on {ref.device}")
    for name in contiguous:
        if not tensors[name].is_contiguous():
            raise ValueError(f"{fn}: {name} must be contiguous (a per-slot cursor tensor), got strides "
                             f"{tuple(tensors[name].stride())}")


def check_ints(cfg: Dict[str, Any], names: Tuple[str, ...], where: str, minimum: int) -> None:
    """Refuse a launch-config entry that is not an int >= ``minimum`` (1: a count; 0: 0 means off)."""
    for name in names:
        val = cfg[name]
        if not isinstance(val, int) or val < minimum:
            what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
            raise ValueError(f"{where}: {name} must be {what}, got {val!r}")


def register_cap(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """Launch options for a config's ``maxnreg`` (0: none; the CPU interpreter takes no register cap)."""
    return {"maxnreg": cfg["maxnreg"]} if cfg["maxnreg"] and not interpreting() else {}


CONFIG_DIR = Path(__file__).resolve().parent / "configs"
ENV_CONFIG_FILE = "SGLANG_REPLAYSSM_KERNEL_CONFIG"


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    if n < 1:
        raise ValueError(f"next_pow2 needs n >= 1, got {n}")
    return 1 << (n - 1).bit_length()


@triton.jit
def softplus(x, THRESHOLD: tl.constexpr):
    """log(1 + e^x) in fp32, identity above THRESHOLD (as SGLang's decode kernels)."""
    return tl.where(x <= THRESHOLD, tl.log(1.0 + tl.exp(x)), x)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def gpu_key() -> str:
    """Name of the config file for the current device ("h200", "h100", ... or "default").

    Cached: the wrappers resolve launch configs on every call, and the device of a process
    does not change."""
    try:
        import torch

        if torch.cuda.is_available():
            name = torch.cuda.get_device_name().lower()
            for key in ("h200", "h100", "h20", "b200", "b300", "a100"):
                if key in name:
                    return key
    except Exception:  # pragma: no cover - device query failures fall back to default
        pass
    return "default"


@functools.lru_cache(maxsize=None)
def _load_yaml(path: str) -> Dict[str, Any]:
    import yaml

    p = Path(path)
    if not p.is_file():
        return {}
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"launch-config file {p} is not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"launch-config file {p} must hold a mapping, got {type(data).__name__}")
    return data


def config_file(explicit: Optional[str] = None) -> Path:
    """The YAML file in force: explicit path, env override, then the per-GPU file."""
    if explicit:
        return Path(explicit)
    env = os.environ.get(ENV_CONFIG_FILE)
    if env:
        return Path(env)
    return CONFIG_DIR / f"{gpu_key()}.yaml"


_DTYPE_TAGS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def dtype_tag(dtype: torch.dtype) -> str:
    """Short name of a state dtype in launch-config keys ("fp32", "bf16", "fp16")."""
    return _DTYPE_TAGS.get(dtype, str(dtype).replace("torch.", ""))


def config_keys(key: str, state_dtype: Optional[torch.dtype]) -> Tuple[str, ...]:
    """Launch-config keys of a geometry, most specific first: ``<key>_S<dtype>`` then ``<key>``
    (a bf16 checkpoint moves half the bytes per tile, so its best tiles may differ)."""
    return (key,) if state_dtype is None else (f"{key}_S{dtype_tag(state_dtype)}", key)


def launch_config(family: str, key, defaults: Dict[str, Any], path: Optional[str] = None) -> Dict[str, Any]:
    """Launch parameters for ``family`` (e.g. "mamba2_output_only") and geometry ``key``.

    ``key`` is one key or a sequence of keys, most specific first (:func:`config_keys`).
    Lookup order, later entries winning: ``defaults``, then per file (``default.yaml``,
    then the GPU's file) ``[family]["default"]`` and the keys from least to most specific.
    Unknown parameter names are an error, so a typo in a tuned file cannot silently fall back.
    """
    keys = [key] if isinstance(key, str) else list(key)
    out = dict(defaults)
    for f in (CONFIG_DIR / "default.yaml", config_file(path)):
        section = _load_yaml(str(f)).get(family) or {}
        for k in ["default"] + keys[::-1]:
            entry = section.get(k)
            if entry:
                unknown = set(entry) - set(defaults)
                if unknown:
                    raise ValueError(
                        f"launch config {f} [{family}][{k}] has unknown parameters {sorted(unknown)}; "
                        f"accepted: {sorted(defaults)}"
                    )
                out.update(entry)
    return out
