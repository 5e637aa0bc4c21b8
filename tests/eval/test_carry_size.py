"""eval/carry_size.py on a scratch git repository: what the device tool would copy, against its 64 MiB."""
import os
import random
import subprocess

from eval import carry_size


def _repo(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    sizes = {"src/a.py": random.randint(10, 5000), "src/deep/b.bin": random.randint(10, 5000),
             "README.md": random.randint(10, 500), "new.txt": random.randint(10, 500)}  # new.txt: untracked
    for rel, n in sizes.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(os.urandom(n))
    (tmp_path / ".gitignore").write_text("bundle/\n*.log\n")
    (tmp_path / "x.log").write_bytes(b"ignored" * 100)
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "big.tar").write_bytes(b"\0" * 3000)
    subprocess.run(["git", "-C", str(tmp_path), "add", "src", "README.md", ".gitignore"], check=True)
    return sizes


def _tar(n):  # a file's share of a tar archive, written out: header block + data padded to 512-byte blocks
    return 512 + 512 * ((n + 511) // 512)


def test_counts_git_files_and_the_carried_paths(tmp_path, capsys):
    sizes = _repo(tmp_path)
    gi = _tar(len((tmp_path / ".gitignore").read_bytes()))
    t = {k: _tar(v) for k, v in sizes.items()}
    m = carry_size.measure(tmp_path)
    assert m["tree"] == {"src": t["src/a.py"] + t["src/deep/b.bin"], "README.md": t["README.md"],
                         "new.txt": t["new.txt"], ".gitignore": gi}  # ignored files are not copied
    base = sum(t.values()) + gi
    assert m["total"] == base and not m["over"]
    m = carry_size.measure(tmp_path, ["bundle", "missing"])
    assert m["carry"] == {"bundle": _tar(3000), "missing": None} and m["total"] == base + _tar(3000)
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "doc.md").write_bytes(b"x" * 77)
    assert carry_size.measure(tmp_path)["carry"] == {"shared": 1024}
    assert carry_size.main(["--root", str(tmp_path), "bundle"]) == 0
    assert "carry bundle" in capsys.readouterr().out


def test_sizes_match_a_tar_of_the_same_files(tmp_path):
    """The estimate is what tar writes for the files, less its end-of-archive blocks and record padding."""
    import tarfile

    _repo(tmp_path)
    files = carry_size._git_files(tmp_path) + ["bundle/big.tar"]
    out = tmp_path.parent / "carry.tar"
    with tarfile.open(out, "w", format=tarfile.USTAR_FORMAT) as tf:
        for rel in files:
            tf.add(tmp_path / rel, arcname=rel, recursive=False)
    m = carry_size.measure(tmp_path, ["bundle"])
    assert m["total"] <= out.stat().st_size <= m["total"] + tarfile.RECORDSIZE + 1024


def test_over_the_limit_exits_nonzero(tmp_path, monkeypatch, capsys):
    _repo(tmp_path)
    monkeypatch.setattr(carry_size, "LIMIT_BYTES", 2000)
    assert carry_size.main(["--root", str(tmp_path), "bundle"]) == 1
    assert "OVER" in capsys.readouterr().out
