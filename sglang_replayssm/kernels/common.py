"""Pieces shared by every ReplaySSM kernel family: Triton helpers and launch configs.

Pure math and plumbing: nothing here imports SGLang. Launch configs (block sizes,
warps, stages): each kernel family registers its parameters once (:func:`register_family`:
built-in default + accepted values, the fastest measured configuration); YAML files under
``kernels/configs/`` override them per GPU and geometry. :func:`launch_config` resolves and
checks one geometry's entry, :func:`validate_config_file` checks a whole file up front.
"""

from __future__ import annotations

import difflib
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

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


def register_cap(cfg: Dict[str, Any], small: bool = False) -> Dict[str, Any]:
    """Launch options for a config's ``maxnreg`` (0: none; the CPU interpreter takes no register cap); ``small``:
    a launch of the family's small batches, whose ``inline_maxnreg`` wins where the family has one and it is
    not -1."""
    cap = cfg["maxnreg"]
    if small and cfg.get("inline_maxnreg", -1) != -1:
        cap = cfg["inline_maxnreg"]
    return {"maxnreg": cap} if cap and not interpreting() else {}


def pdl_on(want: bool, device: torch.device) -> bool:
    """Whether a config's ``pdl`` (``want``) takes effect: programmatic dependent launch (the main kernel scheduled
    while the pre-kernel before it still runs, waiting in-kernel with ``griddepcontrol.wait`` before it reads what that
    kernel wrote) needs a CUDA device of compute capability 9.0 or newer; the CPU interpreter runs kernels one by one
    and takes the option as off."""
    return bool(want) and not interpreting() and _capability_major(device) >= 9


@functools.lru_cache(maxsize=None)
def _capability_major(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_capability(device)[0]


def pdl_launch(on: bool) -> Dict[str, Any]:
    """Launch options of a kernel launched as a programmatic dependent of the kernel before it."""
    return {"launch_pdl": True} if on else {}


@triton.jit
def pdl_wait(ON: tl.constexpr):
    """``ON``: wait until the kernel this one was launched as a dependent of has finished and its writes are
    visible (``griddepcontrol.wait``). Every program of a dependent launch runs it before it reads what that kernel
    wrote, stores anything, or returns, so the launch finishes only after the kernel before it has."""
    if ON:
        gdc_wait()


@triton.jit
def pdl_trigger(ON: tl.constexpr):
    """``ON``: let a dependent launch of the next kernel start scheduling its programs
    (``griddepcontrol.launch_dependents``); what this kernel writes is still only visible to it after its wait."""
    if ON:
        gdc_launch_dependents()


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


@triton.jit
def _suffix_excl_combine(t1, e1, i1, t2, e2, i2):
    """Scan combine of two disjoint index sets: (total, total without the set's lowest index, lowest index).

    Commutative as well as associative, so the result does not depend on which operand the
    compiled or the interpreted reverse scan passes first."""
    first = i1 < i2
    return t1 + t2, tl.where(first, e1 + t2, t1 + e2), tl.minimum(i1, i2)


@triton.jit
def suffix_sum_excl(x, offs):
    """Exclusive suffix sums of a 1-D fp32 tensor: out_j = sum_{i > j} x_i (``offs`` = tl.arange over x).

    Replay weights are exponentials of such sums (sum of the log-decays after position j). Taking
    them as a difference of two prefix sums, or of an inclusive suffix sum and x_j, cancels
    catastrophically when one step is large (dt + dt_bias ~ 22): here every partial sum only
    adds terms of the sequence, so a sum of same-sign terms keeps its relative accuracy. Pad
    masked lanes with zeros. One register scan, no extra loads."""
    _, excl, _ = tl.associative_scan((x, tl.zeros_like(x), offs), 0, _suffix_excl_combine, reverse=True)
    return excl


def suffix_sum_excl_torch(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """PyTorch twin of :func:`suffix_sum_excl` along ``dim``: out_j = sum_{i > j} x_i, summed directly
    (a reversed cumsum of the entries after j, never a difference of two cumulative sums)."""
    n = x.shape[dim]
    tail = torch.flip(torch.cumsum(torch.flip(x.narrow(dim, min(n, 1), max(n - 1, 0)), [dim]), dim), [dim])
    return torch.cat([tail, torch.zeros_like(x.narrow(dim, 0, min(n, 1)))], dim)


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
def _load_yaml(path: str, required: bool = False) -> Dict[str, Any]:
    """The mapping in a launch-config file ({} for a missing per-GPU file; ``required``: a path someone named,
    which must exist)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        if required:
            raise ValueError(f"launch-config file {p} does not exist (set by --replayssm-kernel-config / "
                             f"{ENV_CONFIG_FILE}, or passed as a path)")
        return {}
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"launch-config file {p} is not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"launch-config file {p} must hold a mapping of kernel families, got "
                         f"{type(data).__name__}")
    return data


# the launch-config file of the process's activated ReplaySSM config (:func:`activate_config_file`): a path,
# None (the per-GPU file) or _UNSET (nothing activated: SGLANG_REPLAYSSM_KERNEL_CONFIG, as standalone use reads it)
_UNSET = object()
_ACTIVE_FILE: Any = _UNSET


def activate_config_file(path: Optional[str]) -> None:
    """Hand the kernels the launch-config file of the config in force (its ``kernel_config``; None: the per-GPU
    file), resolved once per process by ``sglang_replayssm.plugin.activate``. This module never imports the
    package's config (SGLang-free); kernels used on their own (benchmarks, tuning, tests) read the env override."""
    global _ACTIVE_FILE
    _ACTIVE_FILE = None if path is None else str(path)


def reset_config_file() -> None:
    """Forget the activated file (``config.reset_for_tests``, ``disable()``): back to the env override."""
    global _ACTIVE_FILE
    _ACTIVE_FILE = _UNSET


def _explicit_file(explicit: Optional[str] = None) -> Optional[str]:
    """The launch-config path someone named (argument, then the activated config's, then the env override of
    standalone use), or None for the per-GPU file."""
    if explicit:
        return explicit
    if _ACTIVE_FILE is not _UNSET:
        return _ACTIVE_FILE
    return os.environ.get(ENV_CONFIG_FILE) or None


def config_file(explicit: Optional[str] = None) -> Path:
    """The YAML file in force: explicit path, env override, then the per-GPU file."""
    named = _explicit_file(explicit)
    return Path(named) if named else CONFIG_DIR / f"{gpu_key()}.yaml"


# ----------------------------------------------------------------------------------
# launch parameters of the kernel families: one registration per family
# ----------------------------------------------------------------------------------
WARP_COUNTS = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class Param:
    """One launch parameter: its built-in default, a test of a value and what is accepted (for messages)."""

    default: Any
    ok: Callable[[Any], bool]
    accepted: str


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_pow2(v: Any) -> bool:
    return _is_int(v) and v > 0 and not v & (v - 1)


def count_param(default: int, minimum: int = 0, what: str = "") -> Param:
    """An int >= ``minimum`` (1: a count; 0: 0 means off)."""
    return Param(default, lambda v: _is_int(v) and v >= minimum, f"an int >= {minimum}{what}")


def block_param(default: int, minimum: int = 1, also: Tuple[int, ...] = (), what: str = "") -> Param:
    """A power of two >= ``minimum`` (a tile size), or one of the special values ``also``."""
    special = "".join(f"{v}, " for v in also)
    return Param(default, lambda v: _is_int(v) and (v in also or (_is_pow2(v) and v >= minimum)),
                 f"{special}a power of two >= {minimum}{what}".replace(", a power", " or a power"))


def warps_param(default: int, zero: bool = False, what: str = "") -> Param:
    """A warp count (``zero``: 0 too, meaning "as num_warps")."""
    allowed = ((0,) if zero else ()) + WARP_COUNTS
    return Param(default, lambda v: _is_int(v) and v in allowed, f"one of {allowed}{what}")


def choice_param(default: str, modes: Tuple[str, ...]) -> Param:
    """One of the mode names ``modes``."""
    return Param(default, lambda v: isinstance(v, str) and v in modes, f"one of {modes}")


def flag_param(default: int) -> Param:
    """0 or 1 (false / true)."""
    return Param(default, lambda v: v in (0, 1) and isinstance(v, (int, bool)), "0 or 1 (false / true)")


def maxnreg_param(default: int, inherit: bool = False, what: str = "") -> Param:
    """A register cap per thread: 0 (none) or 16 to 255 (``inherit``: -1 too, meaning "as maxnreg")."""
    low = -1 if inherit else 0
    return Param(default, lambda v: _is_int(v) and (v in (low, 0) or 16 <= v <= 255),
                 ("-1 (as maxnreg), " if inherit else "") + f"0 (no cap) or an int from 16 to 255{what}")


def dot_precision_param(default: str = "tf32x3") -> Param:
    """An fp32 tl.dot mode that keeps fp32 parity (plain tf32 drifts ~1e-2 and is refused)."""
    return Param(default, lambda v: v in DOT_PRECISIONS, f"one of {DOT_PRECISIONS} (plain tf32 drifts ~1e-2 from fp32)")


_FAMILIES: Dict[str, Dict[str, Param]] = {}
# the modules that register the kernel families (imported by validate_config_file)
_FAMILY_MODULES = ("conv_verify", "gdn_replay", "gdn_verify", "mamba2_replay", "mamba2_verify")


def register_family(family: str, params: Dict[str, Param]) -> Dict[str, Any]:
    """Register a kernel family's launch parameters; returns its built-in defaults (name -> value), which
    :func:`launch_config` and :func:`validate_config_file` both check files against."""
    for name, p in params.items():
        if not p.ok(p.default):
            raise ValueError(f"{family}: built-in default {name}={p.default!r} is not {p.accepted}")
    _FAMILIES[family] = dict(params)
    return {name: p.default for name, p in params.items()}


def family_defaults(family: str) -> Dict[str, Any]:
    """The registered built-in defaults of a kernel family (name -> value)."""
    if family not in _FAMILIES:
        raise ValueError(f"unknown kernel family {family!r}{_did_you_mean(family, _FAMILIES)}; "
                         f"known: {sorted(_FAMILIES)}")
    return {name: p.default for name, p in _FAMILIES[family].items()}


def _did_you_mean(name: str, known) -> str:
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_entry(family: str, entry: Any, accepted, where: str) -> None:
    """Refuse an entry that is not a mapping, names a parameter ``accepted`` lacks, or holds a value its family's
    registration refuses."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: an entry must be a mapping of launch parameters, got {type(entry).__name__}")
    unknown = sorted(set(entry) - set(accepted), key=str)
    if unknown:
        raise ValueError(f"{where}: unknown parameter {unknown[0]!r}{_did_you_mean(unknown[0], accepted)}; "
                         f"accepted: {sorted(accepted)}")
    params = _FAMILIES.get(family, {})
    for name, val in entry.items():
        p = params.get(name)
        if p is not None and not p.ok(val):
            raise ValueError(f"{where}: {name} must be {p.accepted}, got {val!r}")


def _section(p: Path, data: Dict[str, Any], family: str) -> Dict[str, Any]:
    """A family's section of a launch-config file ({} when absent or empty); anything but a mapping is refused."""
    section = data.get(family)
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise ValueError(f"launch config {p} [{family}]: must map \"default\" / geometry keys to entries, got "
                         f"{type(section).__name__}")
    return section


def validate_config_file(path) -> None:
    """Check a whole launch-config file up front: it exists, is YAML holding a mapping of known kernel families,
    and every entry of every family names known parameters with accepted values. Raises ValueError naming the
    file, section, entry and parameter (what a kernel would otherwise raise at its first call, or never)."""
    import importlib

    for mod in _FAMILY_MODULES:
        importlib.import_module(f"{__package__}.{mod}")
    p = Path(path)
    data = _load_yaml.__wrapped__(str(p), True)  # uncached: the file may have changed since a kernel read it
    for family in data:
        if family not in _FAMILIES:
            raise ValueError(f"launch config {p}: unknown section [{family}]{_did_you_mean(family, _FAMILIES)}; "
                             f"known kernel families: {sorted(_FAMILIES)}")
        for key, entry in _section(p, data, family).items():
            where = f"launch config {p} [{family}][{key}]"
            if not isinstance(key, str):
                raise ValueError(f"{where}: an entry key must be \"default\" or a geometry key string")
            _check_entry(family, {} if entry is None else entry, _FAMILIES[family], where)


_DTYPE_TAGS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def dtype_tag(dtype: torch.dtype) -> str:
    """Short name of a state dtype in launch-config keys ("fp32", "bf16", "fp16")."""
    return _DTYPE_TAGS.get(dtype, str(dtype).replace("torch.", ""))


def config_keys(key: str, state_dtype: Optional[torch.dtype]) -> Tuple[str, ...]:
    """Launch-config keys of a geometry, most specific first: ``<key>_S<dtype>``, ``<key>``, then
    ``default_S<dtype>`` (every geometry of that state dtype; a file's ``default`` comes before all of them): a bf16
    checkpoint moves half the bytes per tile, so its best tiles may differ."""
    if state_dtype is None:
        return (key,)
    tag = dtype_tag(state_dtype)
    return (f"{key}_S{tag}", key, f"default_S{tag}")


def launch_config(family: str, key, defaults: Optional[Dict[str, Any]] = None,
                  path: Optional[str] = None) -> Dict[str, Any]:
    """Launch parameters for ``family`` (e.g. "mamba2_output_only") and geometry ``key``.

    ``key`` is one key or a sequence of keys, most specific first (:func:`config_keys`).
    Lookup order, later entries winning: ``defaults`` (None: the family's registered ones), then
    per file (``default.yaml``, then the GPU's file or the named one) ``[family]["default"]``
    and the keys from least to most specific. Each entry used is checked against the family's
    registration (unknown names, refused values), so a typo in a tuned file cannot silently
    fall back; a named file that does not exist is an error.
    """
    if defaults is None:
        defaults = family_defaults(family)
    keys = [key] if isinstance(key, str) else list(key)
    out = dict(defaults)
    named = _explicit_file(path)
    files = ((CONFIG_DIR / "default.yaml", False), (config_file(path), bool(named)))
    for f, required in files:
        section = _section(f, _load_yaml(str(f), required), family)
        for k in ["default"] + keys[::-1]:
            entry = section.get(k)
            if entry:
                _check_entry(family, entry, defaults, f"launch config {f} [{family}][{k}]")
                out.update(entry)
    return out


@triton.jit
def tf32_split(x):
    """x = hi + lo exactly, hi x rounded to tf32 (11 significant bits, ties away from zero), lo the rest: three
    tf32 products hi.hi' + hi.lo' + lo.hi' keep fp32 accuracy (the tensor cores read a tf32 operand's top 19 bits)."""
    hi = ((x.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
    return hi, x - hi


@triton.jit
def split_dot(x, y_hi, y_lo, acc, x_dtype: tl.constexpr):
    """acc + x @ y in fp32 accuracy on the tensor cores: tf32 passes hi.y_lo + lo.y_hi + hi.y_hi (x = hi + lo,
    :func:`tf32_split`); x loaded from a 16-bit type is exact in tf32 (x = hi): two passes."""
    if x_dtype == tl.float32:
        x_hi, x_lo = tf32_split(x)
        acc = tl.dot(x_hi, y_lo, acc, input_precision="tf32")
        acc = tl.dot(x_lo, y_hi, acc, input_precision="tf32")
        return tl.dot(x_hi, y_hi, acc, input_precision="tf32")
    else:
        acc = tl.dot(x, y_lo, acc, input_precision="tf32")
        return tl.dot(x, y_hi, acc, input_precision="tf32")


@triton.jit
def _flush_first_ranks(write_pos, stride_wp, n_rows, L, FF: tl.constexpr):
    """(rows o, in-batch mask, rank of each row): the flush rows (ring full: max(w, 0) >= L - 1, i.e. the kernels'
    clamped w == L - 1) first, each group in row order (launch option ``flush_first_max_batch`` of the decode kernels;
    FF: a power of two >= n_rows)."""
    o = tl.arange(0, FF)
    in_b = o < n_rows
    ws = tl.load(write_pos + o * stride_wp, mask=in_b, other=0).to(tl.int32)
    fl = in_b & (tl.maximum(ws, 0) >= L - 1)
    nf = in_b & (tl.maximum(ws, 0) < L - 1)
    n_fl = tl.sum(fl.to(tl.int32), 0)
    return o, in_b, tl.where(fl, tl.cumsum(fl.to(tl.int32), 0) - 1, n_fl + tl.cumsum(nf.to(tl.int32), 0) - 1)


@triton.jit
def write_flush_first_rank(order, write_pos, stride_wp, n_rows, i_n, L, FF: tl.constexpr):
    """order[rank] = i_n, rank being row i_n's place in :func:`_flush_first_ranks`' order. Written by a
    pre-kernel's (row, 0) programs for the decode kernel's :func:`flush_first_row`."""
    o, in_b, rank = _flush_first_ranks(write_pos, stride_wp, n_rows, L, FF)
    tl.store(order + tl.sum(tl.where(o == i_n, rank, 0), 0), i_n.to(tl.int32))


@triton.jit
def flush_first_rank_row(write_pos, stride_wp, n_rows, L, FF: tl.constexpr):
    """The batch row of this decode program when its grid is (tiles, heads, ranks), found from the write positions
    themselves (the row of rank program_id(2) in :func:`_flush_first_ranks`' order, not read from the order a
    pre-kernel wrote), so that the program needs nothing a pre-kernel wrote to find its row (launch option
    ``pdl_wait: scores``)."""
    o, in_b, rank = _flush_first_ranks(write_pos, stride_wp, n_rows, L, FF)
    return tl.sum(tl.where(in_b & (rank == tl.program_id(2)), o, 0), 0).to(tl.int64)


@triton.jit
def flush_first_row(order):
    """The batch row of this decode program when its grid is (tiles, heads, ranks) (launch option
    ``flush_first_max_batch``): order[rank], written by the pre-kernel with the flush rows first
    (:func:`write_flush_first_rank`). The GPU starts blocks in grid order, so the long flush programs start first
    and the short ones fill in behind them. (Without the option the kernels read (row, head) from the grid's
    second and third axes inline, the same build as before the option.)"""
    return tl.load(order + tl.program_id(2)).to(tl.int64)
