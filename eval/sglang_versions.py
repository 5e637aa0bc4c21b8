"""Run the seam and pool tests (tests/foundation, tests/patches) against each SGLang release; record the counts.

    python -m eval.sglang_versions [--versions 0.5.17,0.5.23] [--jobs N] [--out eval/results/sglang-versions.json]

0.5.17 is the venv's own install. Another release runs in the same venv from its wheel
(``make sglang-wheels``), unpacked once into ``.cache/sglang-site/<version>/`` and put first on
``PYTHONPATH``: a second multi-GB venv is not needed while the release's pure-Python deps are the venv's
(0.5.23 needs torch 2.14.1, which the venv has). Before the tests run, a child interpreter must report
that release through ``importlib.metadata`` and import ``sglang`` from the unpacked copy, else the run
stops. Every tested release's patch targets are also checked: 0.5.17's by import, the others' in their
wheel's source (``patches/source_check.py``; 0.5.15 is checked only that way: it pins an older torch).

Test modules that exercise a release's internals which a later release removed are left out of that
release's run by name, with the reason recorded in the results (``NOT_ON``). Exit status 1 when a test
failed or errored, a run collected nothing, or a target check found a problem.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".cache" / "sglang-wheels"
SITES = ROOT / ".cache" / "sglang-site"
SUITES = ("tests/foundation", "tests/patches")
INSTALLED = "0.5.17"          # the venv's SGLang (Makefile SGLANG_VERSION)
DEFAULT_VERSIONS = ("0.5.17", "0.5.23")
SOURCE_CHECKED = ("0.5.15", "0.5.17", "0.5.23")

# modules a release cannot run, and why (they stay in that release's results as "not_run")
NOT_ON: Dict[str, Dict[str, str]] = {
    "0.5.23": {
        "tests/patches/test_prefix_cache.py":
            "drives sglang.srt.mem_cache.mamba_radix_cache.MambaRadixCache, removed in 0.5.23 (its prefix "
            "cache is UnifiedRadixCache with a mamba component, which reaches the same pool seams: track slot "
            "donation, clear_slots / copy_from)",
        "tests/patches/test_spec_slot_reuse.py":
            "retract/abort through MambaRadixCache, removed in 0.5.23 (UnifiedRadixCache)",
        "tests/patches/test_prefix_cache_backend.py":
            "its CPU harness stubs sglang.srt.layers.linear.get_tp_group, which 0.5.23 replaced by "
            "get_parallel().tp_group (the same seam is run by test_mamba2_decode on 0.5.23)",
        "tests/patches/test_tp_sharding.py":
            "its gloo rank workers call 0.5.17's parallel_state.initialize_model_parallel("
            "tensor_model_parallel_size=...), a signature 0.5.23 changed: the TP harness is not ported to 0.5.23",
    },
}


def wheel_for(version: str, wheels: Path = WHEELS) -> Path:
    found = sorted((wheels / version).glob(f"sglang-{version}-*.whl"))
    if not found:
        raise SystemExit(f"no SGLang {version} wheel under {wheels / version}: run `make sglang-wheels`")
    return found[0]


def unpack(wheel: Path, dest: Path) -> Path:
    """Unpack ``wheel`` into ``dest`` once (a ``.unpacked`` stamp names the wheel); returns ``dest``."""
    stamp = dest / ".unpacked"
    if stamp.is_file() and stamp.read_text().strip() == wheel.name:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp)
    (tmp / ".unpacked").write_text(wheel.name + "\n")
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest


def pythonpath(site: Optional[Path]) -> str:
    """``site`` first, then whatever PYTHONPATH already held."""
    parts = [str(site)] if site else []
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return os.pathsep.join(parts)


def child_env(site: Optional[Path]) -> Dict[str, str]:
    env = dict(os.environ, REPLAYSSM_TEST_SGLANG_WHEELS=str(WHEELS))
    if site is not None:
        env["PYTHONPATH"] = pythonpath(site)
    return env


def imported_sglang(env: Dict[str, str]) -> Dict[str, str]:
    code = ("import importlib.metadata as m, json, sglang\n"
            "print(json.dumps({'version': m.version('sglang'), 'file': sglang.__file__}))")
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"importing sglang failed: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def junit_counts(path: Path) -> Dict[str, int]:
    """run / passed / failed / errors / skipped from a pytest junit XML report (all its suites)."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    c = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    return {"run": c["tests"], "passed": c["tests"] - c["failures"] - c["errors"] - c["skipped"],
            "failed": c["failures"], "errors": c["errors"], "skipped": c["skipped"]}


def source_check(version: str) -> Dict[str, object]:
    """Every patch target applicable to ``version`` found, with its parameters, in that wheel's source."""
    from sglang_replayssm.patches import active_patches
    from sglang_replayssm.patches.source_check import check

    patches = [p for p in active_patches(True, True) if p.applies_to(version)]
    problems = check(patches, wheel_for(version), version)
    return {"targets": len(patches), "problems": problems, "how": "wheel source"}


def import_check() -> Dict[str, object]:
    """The installed release's patch targets resolved by import, with their parameters (registry.status)."""
    from sglang_replayssm.patches import active_patches
    from sglang_replayssm.patches.registry import sglang_version, status

    rows = [r for r in status(active_patches(True, True)) if r[1] != "skipped"]
    return {"targets": len(rows), "problems": [d for _, state, d in rows if state == "missing"],
            "how": f"imported (SGLang {sglang_version()})"}


def run_version(version: str, suites: List[str], jobs: int) -> Dict[str, object]:
    site = None if version == INSTALLED else unpack(wheel_for(version), SITES / version)
    env = child_env(site)
    seen = imported_sglang(env)
    if seen["version"] != version or (site is not None and not seen["file"].startswith(str(site))):
        raise SystemExit(f"SGLang {version} requested but the test interpreter imports {seen['version']} "
                         f"from {seen['file']}")
    skip = NOT_ON.get(version, {})
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *suites,
               *[f"--ignore={m}" for m in skip]]
        if jobs > 1:
            cmd += ["-n", str(jobs), "--dist", "worksteal"]
        print(f"[sglang {version}] {' '.join(cmd[1:])}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.run(cmd, env=env, cwd=ROOT).returncode
        seconds = round(time.monotonic() - t0, 1)
        counts = junit_counts(xml) if xml.is_file() else {"run": 0, "passed": 0, "failed": 0, "errors": 0,
                                                         "skipped": 0}
    return {"sglang_file": os.path.relpath(seen["file"], ROOT), "environment":
            "venv install" if site is None else f"wheel unpacked to {os.path.relpath(site, ROOT)}, first on "
                                                 "PYTHONPATH in the venv",
            "suites": list(suites), "not_run": skip, "pytest_exit": rc, "seconds": seconds, **counts}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", default=",".join(DEFAULT_VERSIONS),
                    help="comma-separated SGLang releases to run the suites against (default: %(default)s)")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("TEST_JOBS", "1")),
                    help="pytest-xdist workers per run (default: $TEST_JOBS or 1)")
    ap.add_argument("--out", help="write the results JSON here (e.g. eval/results/sglang-versions.json)")
    ap.add_argument("suites", nargs="*", default=list(SUITES), help="test paths (default: %(default)s)")
    args = ap.parse_args(argv)
    versions = [v.strip() for v in args.versions.split(",") if v.strip()]
    unknown = [v for v in versions if v != INSTALLED and not (WHEELS / v).is_dir()]
    if unknown:
        ap.error(f"--versions {','.join(unknown)}: no wheel under {WHEELS} (make sglang-wheels)")

    from eval.bench_common import git_commit
    from sglang_replayssm.patches.registry import TESTED_SGLANG

    results = {v: run_version(v, args.suites, args.jobs) for v in versions}
    checks = {v: import_check() if v == INSTALLED else source_check(v) for v in SOURCE_CHECKED}
    summary: Dict[str, object] = {"tested_releases": list(TESTED_SGLANG)}
    for v, r in results.items():
        key = "sglang_" + v.replace(".", "_")
        summary[f"{key}_tests_passed"] = r["passed"]
        summary[f"{key}_tests_failed"] = r["failed"] + r["errors"]
        summary[f"{key}_tests_skipped"] = r["skipped"]
    for v, c in checks.items():
        summary["sglang_" + v.replace(".", "_") + "_target_problems"] = len(c["problems"])
    doc = {"git_commit": git_commit(), "python": sys.version.split()[0], "versions": results,
           "patch_target_source_check": checks, "summary": summary}
    text = json.dumps(doc, indent=2) + "\n"
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    print(json.dumps(summary, indent=2))
    bad = [v for v, r in results.items() if r["failed"] or r["errors"] or r["run"] == 0 or r["pytest_exit"] != 0]
    bad += [f"{v} targets" for v, c in checks.items() if c["problems"]]
    if bad:
        print(f"FAILED: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
