"""The one typed configuration of sglang_replayssm.

Every setting has three spellings, applied in this order (later wins):

1. an optional YAML file (``SGLANG_REPLAYSSM_CONFIG`` / ``--replayssm-config``),
2. environment variables ``SGLANG_REPLAYSSM_<NAME>`` (inherited by SGLang's spawned
   scheduler processes, which is how the settings reach them),
3. launcher flags ``--replayssm-<name>``.

Bad values, unknown YAML keys and unknown ``SGLANG_REPLAYSSM_*`` variables raise one
:class:`ConfigError` that names the setting and the accepted values.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

ENV_PREFIX = "SGLANG_REPLAYSSM_"
FLAG_PREFIX = "--replayssm-"

SPEC_MAX_RUNNING = ("sglang", "auto")
SSM_TYPES = ("mamba2", "gdn")
LOG_LEVELS = ("debug", "info", "warning", "error")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class ConfigError(ValueError):
    """A setting has a bad value; the message names the setting and what is accepted."""


def _parse_bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise ConfigError(f"{name}={v!r} is not a boolean; accepted: {', '.join(_TRUE + _FALSE[:-1])}")


def _parse_auto_bool(name: str, v: Any) -> Optional[bool]:
    """A boolean, or ``auto`` (None: decided from another setting)."""
    if v is None or (isinstance(v, str) and v.strip().lower() == "auto"):
        return None
    try:
        return _parse_bool(name, v)
    except ConfigError:
        raise ConfigError(f"{name}={v!r} is not a boolean or auto; accepted: auto, "
                          f"{', '.join(_TRUE + _FALSE[:-1])}") from None


def _parse_buffer_len(name: str, v: Any) -> int:
    try:
        n = int(str(v).strip()) if not isinstance(v, bool) else None
    except ValueError:
        n = None
    if n is None or n < 1 or n > 256:
        raise ConfigError(f"{name}={v!r}: the ring buffer length L must be an integer in [1, 256]")
    return n


def _choice(choices: Sequence[str]) -> Callable[[str, Any], str]:
    def parse(name: str, v: Any) -> str:
        s = str(v).strip().lower()
        if s not in choices:
            raise ConfigError(f"{name}={v!r}: unknown value; accepted: {', '.join(choices)}")
        return s

    return parse


def _parse_ssm_types(name: str, v: Any) -> Tuple[str, ...]:
    items = v if isinstance(v, (list, tuple)) else str(v).split(",")
    out: List[str] = []
    for it in items:
        s = str(it).strip().lower()
        if not s:
            continue
        if s not in SSM_TYPES:
            raise ConfigError(f"{name}={v!r}: unknown SSM type {s!r}; accepted: {', '.join(SSM_TYPES)}")
        if s not in out:
            out.append(s)
    if not out:
        raise ConfigError(f"{name}={v!r}: name at least one SSM type; accepted: {', '.join(SSM_TYPES)}")
    return tuple(out)


def _parse_path(name: str, v: Any) -> Optional[str]:
    if v is None or str(v).strip() == "":
        return None
    return str(v)


def _parse_existing_file(name: str, v: Any) -> Optional[str]:
    """A file that must exist when named, made absolute (spawned processes may not share the cwd)."""
    path = _parse_path(name, v)
    if path is None:
        return None
    if not Path(path).is_file():
        raise ConfigError(f"{name}={v!r}: file does not exist")
    return os.path.abspath(path)


@dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[str, Any], Any]
    help: str
    metavar: str = ""

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return FLAG_PREFIX + self.name.replace("_", "-")


SETTINGS: Tuple[Setting, ...] = (
    Setting("enable", _parse_bool, "apply the ReplaySSM patches in every SGLang process "
            "(the launcher sets it; plain `python -m sglang.launch_server` stays stock unless it is set)", "BOOL"),
    Setting("buffer_len", _parse_buffer_len, "ring length L: the SSM state is written every L decode steps (default 16)", "L"),
    Setting("ssm_types", _parse_ssm_types, "comma-separated SSM layer types to run on the replay ring: "
            "mamba2, gdn (default both)", "TYPES"),
    Setting("spec", _parse_bool, "use the replay-ring verifier under EAGLE/MTP speculative decoding (default on)", "BOOL"),
    Setting("spec_max_running", _choice(SPEC_MAX_RUNNING), "max running requests under the ring verifier: "
            "auto (solved from memory like non-speculative SGLang, at most the decode CUDA-graph batch; the "
            "launcher's default when --max-running-requests is not given) or sglang (SGLang's own: 48 under "
            "speculative decoding unless --max-running-requests; the default for plugin-only use)", "MODE"),
    Setting("replay_ring", _parse_bool, "apply the replay-ring seams: ring pool, Mamba2/GDN decode and verify, spec "
            "commit, slot lifecycle (default on). false keeps SGLang's own SSM kernels and state pool and applies "
            "only the launch checks, for an A/B inside one install", "BOOL"),
    Setting("extra_buffer", _parse_bool, "serve SGLang's extra_buffer prefix-caching strategy (its default with "
            "the radix cache and the overlap scheduler), with and without speculative decoding: the states SGLang "
            "tracks for the radix tree are materialised from the ring (default on). false: the launcher refuses "
            "extra_buffer and names no_buffer and --disable-radix-cache", "BOOL"),
    Setting("conv_verify", _parse_auto_bool, "run the speculative target verify's causal conv1d (its outputs, the "
            "per-draft conv windows the rollback reads, the new conv state) with the package's Triton kernel "
            "instead of SGLang's causal_conv1d_update (default auto: on with the replay ring, off with "
            "--replayssm-replay-ring false)", "BOOL|auto"),
    Setting("log_level", _choice(LOG_LEVELS), "log level of the sglang_replayssm logger (default info)", "LEVEL"),
    Setting("kernel_config", _parse_existing_file, "YAML file of tuned kernel launch configs, used instead of the "
            "packaged file for the detected GPU and read over the packaged default.yaml", "PATH"),
)
_BY_NAME: Dict[str, Setting] = {s.name: s for s in SETTINGS}
# old setting names read as the new ones for one release (YAML key, env variable, flag, replace() keyword); each
# spelling used logs one deprecation line per process. Giving both names with different values is an error.
DEPRECATED_NAMES: Dict[str, str] = {"staged": "replay_ring"}
_DEPRECATED: Dict[str, Setting] = {
    old: Setting(old, _BY_NAME[new].parse, f"deprecated alias of {FLAG_PREFIX}{new.replace('_', '-')} "
                 "(removed in the next release)", _BY_NAME[new].metavar)
    for old, new in DEPRECATED_NAMES.items()}
DEPRECATED_ENV: Tuple[str, ...] = tuple(s.env for s in _DEPRECATED.values())
_WARNED: set = set()


def _warn_deprecated(old: str, new: str) -> None:
    if old not in _WARNED:
        _WARNED.add(old)
        logging.getLogger("sglang_replayssm").warning(
            "sglang_replayssm: %s is deprecated and will be removed in the next release; use %s", old, new)


CONFIG_FILE_ENV = ENV_PREFIX + "CONFIG"
CONFIG_FILE_FLAG = FLAG_PREFIX + "config"
ENABLE_ENV = _BY_NAME["enable"].env
DISABLE_FLAG = FLAG_PREFIX + "disable"


def enable_requested(environ: Mapping[str, str]) -> bool:
    """Whether ``SGLANG_REPLAYSSM_ENABLE`` asks for the patches: set to anything but an off value
    (empty, 0, false, no, off). An unparsable value (a typo of "true") counts as asked for, so the
    plugin fails on it loudly instead of serving stock SGLang."""
    v = environ.get(ENABLE_ENV)
    return v is not None and v.strip().lower() not in _FALSE


@dataclass(frozen=True)
class ReplaySSMConfig:
    enable: bool = False
    buffer_len: int = 16
    ssm_types: Tuple[str, ...] = SSM_TYPES
    spec: bool = True
    spec_max_running: str = "sglang"
    replay_ring: bool = True
    extra_buffer: bool = True
    conv_verify: Optional[bool] = None  # None: auto, follows replay_ring (conv_verify_on)
    log_level: str = "info"
    kernel_config: Optional[str] = None
    source: Dict[str, str] = field(default_factory=dict, compare=False)

    def replace(self, **kw) -> "ReplaySSMConfig":
        return _merge(self, kw, "code")

    def to_env(self) -> Dict[str, str]:
        """Environment that reproduces this config in a child process."""
        env: Dict[str, str] = {}
        for s in SETTINGS:
            v = getattr(self, s.name)
            if v is None:
                if s.parse is _parse_auto_bool:  # auto travels as itself, over any inherited value
                    env[s.env] = "auto"
                continue
            if isinstance(v, bool):
                env[s.env] = "1" if v else "0"
            elif isinstance(v, tuple):
                env[s.env] = ",".join(v)
            else:
                env[s.env] = str(v)
        return env

    @property
    def conv_verify_on(self) -> bool:
        """Whether the conv1d verify seam applies: ``conv_verify``, or with ``auto`` the replay ring's setting."""
        return self.replay_ring if self.conv_verify is None else self.conv_verify

    def as_dict(self) -> Dict[str, Any]:
        return {s.name: getattr(self, s.name) for s in SETTINGS}

    @property
    def staged(self) -> bool:
        """Deprecated name of :attr:`replay_ring` (removed in the next release)."""
        _warn_deprecated("ReplaySSMConfig.staged", "ReplaySSMConfig.replay_ring")
        return self.replay_ring


def _merge(cfg: ReplaySSMConfig, values: Mapping[str, Any], origin: str, label=None) -> ReplaySSMConfig:
    updates: Dict[str, Any] = {}
    source = dict(cfg.source)
    for k, v in values.items():
        if k in DEPRECATED_NAMES:
            continue
        s = _BY_NAME.get(k)
        if s is None:
            raise ConfigError(f"unknown setting {k!r} ({origin}); accepted: {', '.join(_BY_NAME)}")
        shown = label(s) if label else k
        updates[k] = s.parse(shown, v)
        source[k] = origin
    for old, new in DEPRECATED_NAMES.items():
        if old not in values:
            continue
        shown_old = label(_DEPRECATED[old]) if label else old
        shown_new = label(_BY_NAME[new]) if label else new
        value = _BY_NAME[new].parse(shown_old, values[old])
        if new in updates and updates[new] != value:
            raise ConfigError(f"{shown_old} (deprecated) and {shown_new} disagree ({values[old]!r} vs "
                              f"{values[new]!r}): set only {shown_new}")
        _warn_deprecated(shown_old, shown_new)
        updates[new] = value
        source[new] = origin
    return dataclasses.replace(cfg, source=source, **updates)


def load_yaml(path: str | os.PathLike) -> Dict[str, Any]:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{CONFIG_FILE_ENV}: config file {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{CONFIG_FILE_ENV}: {p} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{CONFIG_FILE_ENV}: {p} must hold a mapping of settings, got {type(data).__name__}")
    # accept both snake_case and dashed keys
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def from_env(environ: Optional[Mapping[str, str]] = None, base: Optional[ReplaySSMConfig] = None) -> ReplaySSMConfig:
    """Config from (YAML file named by env, then) ``SGLANG_REPLAYSSM_*`` variables."""
    environ = os.environ if environ is None else environ
    cfg = base or ReplaySSMConfig()
    yaml_path = environ.get(CONFIG_FILE_ENV)
    if yaml_path:
        cfg = _merge(cfg, load_yaml(yaml_path), f"yaml:{yaml_path}")
    known = {s.env for s in SETTINGS} | set(DEPRECATED_ENV) | {CONFIG_FILE_ENV}
    unknown = sorted(k for k in environ if k.startswith(ENV_PREFIX) and k not in known)
    if unknown:
        raise ConfigError(f"unknown environment variable(s) {', '.join(unknown)}; accepted: {', '.join(sorted(known))}")
    vals = {s.name: environ[s.env] for s in SETTINGS + tuple(_DEPRECATED.values()) if s.env in environ}
    return _merge(cfg, vals, "env", label=lambda s: s.env)


# ----------------------------------------------------------------------------------
# the config in force in this process: parsed once, or set by activate()
# ----------------------------------------------------------------------------------
_ACTIVE: Optional[ReplaySSMConfig] = None


def activate(cfg: ReplaySSMConfig) -> ReplaySSMConfig:
    """Make ``cfg`` the config in force in this process (the plugin, the launcher and ``enable()`` call it);
    the seams read it through :func:`current` instead of parsing the environment again."""
    global _ACTIVE
    _ACTIVE = cfg
    return cfg


def current() -> ReplaySSMConfig:
    """The config in force in this process: the one :func:`activate` set, else the environment's, parsed on
    the first call and kept (SGLang's processes inherit the variables at start and never change them)."""
    global _ACTIVE
    if _ACTIVE is None:
        _ACTIVE = from_env()
    return _ACTIVE


def deactivate() -> None:
    """Forget the config in force (and the kernels' activated launch-config file), so the next :func:`current`
    parses the environment again (``disable()``, and a failed ``enable()`` that restored the environment)."""
    global _ACTIVE
    _ACTIVE = None
    import sys

    common = sys.modules.get(__package__ + ".kernels.common")  # never imported here just to reset it
    if common is not None:
        common.reset_config_file()


def reset_for_tests() -> None:
    """For tests that change ``SGLANG_REPLAYSSM_*`` variables: the next :func:`current` sees the change (a new
    SGLang process would). ``tests/conftest.py`` calls it around every test."""
    deactivate()


@dataclass(frozen=True)
class LauncherFlag:
    """One ``--replayssm-*`` flag of the launcher: the one table both :func:`add_flags` (what the launcher
    accepts) and :func:`flags_help` (what ``sglang-replayssm flags`` prints) are made from."""

    flag: str
    dest: str
    env: str
    help: str
    metavar: str = ""
    const: Optional[str] = None  # a switch (no value) storing this


def launcher_flags() -> List[LauncherFlag]:
    """The launcher's flags: ``--replayssm-config``, ``--replayssm-disable`` (the launcher enables the
    patches itself, so ``enable`` has no flag of its own) and one per other setting."""
    out = [LauncherFlag(CONFIG_FILE_FLAG, "replayssm_config", CONFIG_FILE_ENV,
                        "YAML file of ReplaySSM settings", "YAML")]
    for s in SETTINGS:
        if s.name == "enable":
            out.append(LauncherFlag(DISABLE_FLAG, "replayssm_enable", s.env + "=0",
                                    "launch stock SGLang through this launcher (no patches)", const="0"))
        else:
            out.append(LauncherFlag(s.flag, "replayssm_" + s.name, s.env, s.help, s.metavar))
    for s in _DEPRECATED.values():
        out.append(LauncherFlag(s.flag, "replayssm_" + s.name, s.env, s.help, s.metavar))
    return out


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add the ``--replayssm-*`` flags (all default None = not given)."""
    group = parser.add_argument_group("ReplaySSM (sglang_replayssm)")
    for f in launcher_flags():
        if f.const is not None:
            group.add_argument(f.flag, dest=f.dest, action="store_const", const=f.const, default=None,
                               help=f"{f.help} (env {f.env})")
        else:
            group.add_argument(f.flag, dest=f.dest, default=None, metavar=f.metavar, help=f"{f.help} (env {f.env})")


def unknown_flag_error(argv: Sequence[str]) -> Optional[str]:
    """The error for the first ``--replayssm-*`` word in ``argv`` (what the launcher's own parser left over)
    that is not a launcher flag, with the closest one; None when there is none."""
    import difflib

    known = [f.flag for f in launcher_flags()]
    for a in argv:
        name = a.split("=", 1)[0]
        if name.startswith(FLAG_PREFIX) and name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            if name == _BY_NAME["enable"].flag:
                hint = f" (the launcher enables ReplaySSM itself; {DISABLE_FLAG} turns it off)"
            return (f"unrecognized ReplaySSM flag {name}{hint}; the --replayssm-* flags are listed by "
                    "`sglang-replayssm flags`")
    return None


def from_flags(ns: argparse.Namespace, environ: Optional[Mapping[str, str]] = None) -> ReplaySSMConfig:
    """Launcher config: env/YAML first, then the flags; enabled unless --replayssm-disable."""
    environ = dict(os.environ if environ is None else environ)
    if getattr(ns, "replayssm_config", None):
        environ[CONFIG_FILE_ENV] = ns.replayssm_config
    cfg = from_env(environ)
    vals = {s.name: getattr(ns, "replayssm_" + s.name) for s in SETTINGS + tuple(_DEPRECATED.values())
            if getattr(ns, "replayssm_" + s.name, None) is not None}
    vals.setdefault("enable", True)
    return _merge(cfg, vals, "flag", label=lambda s: s.flag)


def flags_help() -> str:
    """What ``sglang-replayssm flags`` prints: exactly the flags the launcher accepts."""
    lines = []
    for f in launcher_flags():
        shown = f.flag if f.const is not None else f"{f.flag} {f.metavar}"
        lines.append(f"  {shown:<34} {f.env:<36} {f.help}")
    return "\n".join(lines)
