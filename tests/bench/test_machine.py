"""The machine record of a benchmark names the code that ran by a digest of its sources."""

import shutil

import lightning_attention
from lightning_attention.bench.machine import machine_info, source_digest


def test_source_digest_names_the_code_that_ran(tmp_path):
    package = tmp_path / "lightning_attention"
    shutil.copytree(lightning_attention.__path__[0], package, ignore=shutil.ignore_patterns("__pycache__"))
    digest = source_digest(package)
    assert digest == source_digest() and len(digest) == 16  # a copy of the imported package: the same digest
    assert machine_info("cpu")["source_sha256"] == digest

    (package / "notes.txt").write_text("not Python")  # only the sources count
    assert source_digest(package) == digest
    launch = package / "ops" / "lightning" / "launch.py"
    launch.write_text(launch.read_text() + "\n")  # one byte more in one file
    assert source_digest(package) != digest
    launch.write_text(launch.read_text()[:-1])
    assert source_digest(package) == digest
    launch.rename(package / "ops" / "lightning" / "launch_moved.py")  # same bytes, another path
    assert source_digest(package) != digest
