"""eval/gpu_spec_variants.sh without a GPU: a stand-in ``python3`` first on PATH records each ``-m eval.bench_*``
call and writes its --out JSON; the variant YAMLs are written by the real eval.config_variant."""

import os
import pathlib
import subprocess
import sys
import tarfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
T8 = ("t8={mamba2_verify: {H128_P64_N128_G8_R24_T8: {nonflush: chunked, BLOCK_M: 16}}, "
      "gdn_verify: {HV32_HK16_K128_V128_R24_T8: {maxnreg: 0}}}")


def _run(tmp_path, *args, bench="tree"):
    calls = tmp_path / "calls.txt"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "python3"
    shim.write_text(f"""#!{sys.executable}
import json, os, shutil, sys
if sys.argv[1:3] == ["-c", "import sglang"]:
    sys.exit(0)
if len(sys.argv) > 2 and sys.argv[1] == "-m" and sys.argv[2].startswith("eval.bench_"):
    with open({str(calls)!r}, "a") as f:
        f.write(os.environ.get("SGLANG_REPLAYSSM_KERNEL_CONFIG", "") + " | " + " ".join(sys.argv[2:]) + "\\n")
    cfg = os.environ.get("SGLANG_REPLAYSSM_KERNEL_CONFIG")
    if cfg:
        shutil.copy(cfg, {str(tmp_path)!r} + "/seen-" + os.path.basename(cfg))
    open(sys.argv[sys.argv.index("--out") + 1], "w").write(json.dumps({{"summary": {{}}}}))
    sys.exit(0)
os.execv({sys.executable!r}, [{sys.executable!r}] + sys.argv[1:])
""")
    shim.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "BENCH": bench, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT)}
    r = subprocess.run(["bash", "eval/gpu_spec_variants.sh", *args], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    return r, out, calls


def test_tree_bench_times_each_variant_with_its_config(tmp_path):
    r, out, calls = _run(tmp_path, "packaged=", T8)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    ran = calls.read_text().splitlines()
    assert len(ran) == 2 and all("eval.bench_tree_spec --out" in c and c.endswith("--batches 8 64") for c in ran)
    assert ran[0].startswith(" | ") and "variant-t8.yaml | " in ran[1]  # packaged: no file; t8: its own
    cfg = yaml.safe_load((tmp_path / "seen-variant-t8.yaml").read_text())
    assert cfg["mamba2_verify"]["H128_P64_N128_G8_R24_T8"] == {"nonflush": "chunked", "BLOCK_M": 16}
    assert cfg["gdn_verify"]["HV32_HK16_K128_V128_R24_T8"] == {"maxnreg": 0}
    assert sorted(p.name for p in out.iterdir()) == ["tree-variants.tgz"]  # no pick for trees
    with tarfile.open(out / "tree-variants.tgz") as t:
        names = {pathlib.Path(n).name for n in t.getnames()}
    assert {"tree-packaged.json.gz", "tree-t8.json.gz", "tree-t8.log"} <= names  # the records as committed


def test_unknown_bench_is_refused(tmp_path):
    r, _, calls = _run(tmp_path, bench="trees")
    assert r.returncode == 2 and "BENCH must be spec, kernels or tree, got 'trees'" in r.stderr
    assert not calls.exists()
