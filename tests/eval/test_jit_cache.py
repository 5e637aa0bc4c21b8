"""eval/jit_cache.sh: save trims Triton's text IRs and xz-packs the other JIT builds; restore unpacks them."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(*args, cwd, root, home):
    env = dict(os.environ, SGLANG_CACHE_ROOT=str(root), HOME=str(home))
    return subprocess.run(["bash", str(REPO / "eval" / "jit_cache.sh"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_save_then_restore_round_trip(tmp_path):
    root = tmp_path / "cache"
    for rel, text in (("triton/k1/k.cubin", "cubin"), ("triton/k1/k.json", "{}"), ("triton/k1/k.ptx", "ptx"),
                      ("triton/k1/k.ttgir", "ir"), ("flashinfer/ops/top_k.so", "so"), ("tvm-ffi/a/b.so", "b")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    home = tmp_path / "home"
    tuned = home / ".cache" / "sglang" / "flashinfer" / "autotune" / "sm90" / "rank_tp0.json"
    tuned.parent.mkdir(parents=True)
    tuned.write_text('{"tuned": 1}')
    out = tmp_path / "out"
    r = _run("save", str(out), cwd=tmp_path, root=root, home=home)
    assert r.returncode == 0, r.stderr
    assert {p.name for p in out.iterdir()} == {"jit-triton.txz", "jit-other.txz", "jit-home.txz"}
    names = subprocess.run(["tar", "tJf", str(out / "jit-triton.txz")], capture_output=True, text=True).stdout
    assert "triton/k1/k.cubin" in names and "k.json" in names and ".ptx" not in names and ".ttgir" not in names
    # restore from a checkout's .sglang-bundle/jitcache/
    work = tmp_path / "work"
    (work / ".sglang-bundle" / "jitcache").mkdir(parents=True)
    for name in ("jit-other.txz", "jit-triton.txz", "jit-home.txz"):
        (out / name).rename(work / ".sglang-bundle" / "jitcache" / name)
    fresh, fresh_home = tmp_path / "fresh", tmp_path / "fresh-home"
    r = _run("restore", cwd=work, root=fresh, home=fresh_home)
    assert r.returncode == 0, r.stderr
    assert (fresh / "flashinfer" / "ops" / "top_k.so").read_text() == "so"
    assert (fresh / "tvm-ffi" / "a" / "b.so").read_text() == "b"
    assert (fresh / "triton" / "k1" / "k.cubin").read_text() == "cubin" and not (fresh / "triton" / "k1" / "k.ptx").exists()
    # the autotune results go back under $HOME, not under the cache root
    assert (fresh_home / tuned.relative_to(home)).read_text() == '{"tuned": 1}'
    assert not (fresh / ".cache").exists()


def test_usage_error():
    r = subprocess.run(["bash", str(REPO / "eval" / "jit_cache.sh"), "frob"], capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr
