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


SERVER_SCRIPTS = ("gpu_ab.sh", "gpu_e2e.sh", "gpu_prefix.sh", "gpu_soak.sh", "gpu_streaming_cap.sh")


def test_every_server_script_restores_carried_caches_and_returns_them():
    """A GPU call that starts servers unpacks the carried caches before the bundle's bootstrap and ends by packing
    the (cumulative) caches into $OUT, so the next call of any kind starts warm."""
    for name in SERVER_SCRIPTS:
        text = (REPO / "eval" / name).read_text()
        restore, boot = text.find("bash eval/jit_cache.sh restore"), text.find("source .sglang-bundle/bootstrap.sh")
        assert 0 <= restore < boot, name
        assert 'bash eval/jit_cache.sh save "$OUT"' in text, name


def test_a_dry_run_returns_no_caches(tmp_path):
    root = tmp_path / "cache"
    (root / "triton" / "k1").mkdir(parents=True)
    (root / "triton" / "k1" / "k.cubin").write_text("cubin")
    out = tmp_path / "out"
    env = dict(os.environ, SGLANG_CACHE_ROOT=str(root), HOME=str(tmp_path / "home"), OUT=str(out),
               PYTHON=str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv").exists() else "python3")
    r = subprocess.run(["bash", "eval/gpu_ab.sh", "--model", "tiny-nemotron-h", "--dry-run"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert not list(out.glob("jit-*.txz"))
