"""Will the working tree travel to the GPU host?  The device tool copies the tracked files, the untracked files
git does not ignore, a ``shared/`` folder where the checkout has one, and the ignored paths named in ``carry``
-- 64 MiB in all -- and refuses a call above that.

    python -m eval.carry_size [PATH ...]        # e.g. .sglang-bundle, or some of its files
    make carry-size [CARRY=".sglang-bundle"]

Each file counts as a tar archive holds it: a 512-byte header and its bytes padded to 512 (the tool refused a
call whose files summed to 62.7 MiB and whose tar came to 64.1 MiB; about 1,900 files make that difference).
Prints the total against the limit with the largest contributors, and exits 1 when it is over (before a GPU call
is spent on finding out).  The offline SGLang bundle is about 39 MB, which leaves the tree about 26 MB.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

LIMIT_BYTES = 64 * 2**20


def _git_files(root: Path) -> List[str]:
    out = []
    for extra in ([], ["--others", "--exclude-standard"]):
        r = subprocess.run(["git", "ls-files", "-z", *extra], cwd=root, capture_output=True, check=True)
        out += [p for p in r.stdout.decode().split("\0") if p]
    return out


TAR_BLOCK = 512


def _tar_size(nbytes: int) -> int:
    """A file's share of a tar archive: its header block and its bytes padded to whole blocks."""
    return TAR_BLOCK + -(-nbytes // TAR_BLOCK) * TAR_BLOCK


def _size(path: Path) -> int:
    if path.is_symlink() or path.is_file():
        return _tar_size(path.lstat().st_size)
    return sum(_tar_size(p.lstat().st_size) for p in path.rglob("*") if p.is_file() or p.is_symlink())


def measure(root: Path, carry: Sequence[str] = ()) -> Dict[str, object]:
    """Bytes per part as a tar archive holds them: ``tree`` (git's files, by top-level folder) and each carried
    path; a missing carried path is reported (the device tool removes it on the host)."""
    root = Path(root)
    by_top: Dict[str, int] = {}
    for rel in _git_files(root):
        p = root / rel
        if p.exists() or p.is_symlink():
            top = rel.split("/", 1)[0]
            by_top[top] = by_top.get(top, 0) + _size(p)
    carried = {c: (_size(root / c) if (root / c).exists() else None) for c in carry}
    if (root / "shared").is_dir() and "shared" not in carried:  # the device tool copies a checkout's shared/ too
        carried["shared"] = _size(root / "shared")
    total = sum(by_top.values()) + sum(v for v in carried.values() if v)
    return {"limit": LIMIT_BYTES, "total": total, "tree": by_top, "carry": carried, "over": total > LIMIT_BYTES}


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.carry_size", description=__doc__.split("\n\n")[0])
    ap.add_argument("carry", nargs="*", help="ignored paths the GPU call will carry (relative to the repo root)")
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    args = ap.parse_args(argv)
    m = measure(Path(args.root), args.carry)
    rows: List[Tuple[str, int]] = sorted(m["tree"].items(), key=lambda kv: -kv[1])[:8]
    print(f"working tree + carry: {_mb(m['total'])} of {_mb(m['limit'])} (64 MiB)"
          f"{' -- OVER: the device tool will refuse the call' if m['over'] else ''}")
    for name, n in rows:
        print(f"  tree  {name:<28} {_mb(n)}")
    for name, n in m["carry"].items():
        print(f"  carry {name:<28} {_mb(n) if n is not None else 'missing (removed on the host)'}")
    return 1 if m["over"] else 0


if __name__ == "__main__":
    sys.exit(main())
