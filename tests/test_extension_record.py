"""What ``python -m pyg_dfgnn info`` and the load errors report about the
extension: the build record compiled into the library (read without loading it),
a library built against another torch, and an install record made for another
torch."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

import pyg_dfgnn
from pyg_dfgnn import extension

ROOT = Path(__file__).resolve().parents[1]
RUNNING = torch.__version__.split("+")[0]


def _record(torch_version: str, arch=(800, 900)) -> bytes:
    body = json.dumps({"torch": torch_version, "cudart": 13000, "nvcc": "13.0",
                       "arch": list(arch)})
    return extension.RECORD_MARKER + body.encode() + b"\0"


def test_record_read_from_the_file(tmp_path):
    lib = tmp_path / "lib.so"
    lib.write_bytes(os.urandom(4096) + _record("2.11.0") + os.urandom(4096))
    assert extension._read_library_record(str(lib)) == {
        "torch": "2.11.0", "cuda": "13.0", "nvcc": "13.0", "arch": ["sm_80", "sm_90"]}
    lib.write_bytes(os.urandom(1024))
    assert extension._read_library_record(str(lib)) == {}
    # the exported symbol read as a C string: no terminator after the record
    assert extension._record_from_bytes(_record("2.11.0")[:-1])["torch"] == "2.11.0"


def test_torch_mismatch_is_one_line():
    assert extension.torch_mismatch({"torch": RUNNING}) == ""
    line = extension.torch_mismatch({"torch": "1.0.0"})
    assert "1.0.0" in line and RUNNING in line and "\n" not in line
    assert extension.REBUILD in line


def _run_info(tmp_path, lib_bytes=None, install_record=None):
    """``info`` and the warnings of a copy of the package, with a stand-in library
    ``_C`` (bytes that do not load) and an install record."""
    pkg = tmp_path / "pyg_dfgnn"
    shutil.copytree(ROOT / "pyg_dfgnn", pkg,
                    ignore=shutil.ignore_patterns("_C*", "__pycache__", "_build_info.json"))
    if lib_bytes is not None:
        (pkg / f"_C{sysconfig.get_config_var('EXT_SUFFIX')}").write_bytes(lib_bytes)
    if install_record is not None:
        (pkg / "_build_info.json").write_text(json.dumps(install_record))
    code = ("import sys; sys.meta_path = [f for f in sys.meta_path "
            "if 'editable' not in str(getattr(f, '__module__', ''))]; "  # an editable install
            "from pyg_dfgnn.__main__ import main; main(['info'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    return r


def test_library_built_against_another_torch(tmp_path):
    """A library that fails to load and records another torch: one line naming
    both versions and the rebuild, in the warning and in ``info``."""
    r = _run_info(tmp_path, lib_bytes=b"\x7fELF-not-a-library" + _record("1.0.0"))
    line = f"pyg_dfgnn._C was built against torch 1.0.0, this is torch {RUNNING}"
    assert line in r.stderr
    assert f"extension _C     {line}" in r.stdout
    assert "fused kernels    no" in r.stdout


def test_library_without_record_that_fails_to_load(tmp_path):
    r = _run_info(tmp_path, lib_bytes=b"\x7fELF-not-a-library")
    assert "pyg_dfgnn._C failed to load" in r.stdout and extension.REBUILD in r.stdout


def test_install_record_of_another_torch(tmp_path):
    """A record that another environment's install left in the source tree is
    not reported as this environment's reason."""
    r = _run_info(tmp_path, install_record={"extension": False, "reason": "a CPU build",
                                            "torch": "2.0.0+cpu", "prefix": "/elsewhere"})
    assert "not built for this torch" in r.stdout and "2.0.0+cpu" in r.stdout
    assert "a CPU build" not in r.stdout


def test_install_record_of_this_torch(tmp_path):
    r = _run_info(tmp_path, install_record={"extension": False, "reason": "a CPU build",
                                            "torch": torch.__version__, "prefix": sys.prefix})
    assert "pyg_dfgnn._C not built: a CPU build" in r.stdout


@pytest.mark.cuda
def test_loaded_library_records_this_build():
    """The compiled extension's record: the running torch, and code for this GPU."""
    record = extension.build_info()
    assert record["torch"] == RUNNING
    assert record["cuda"].split(".")[0] == torch.version.cuda.split(".")[0]
    major, minor = torch.cuda.get_device_capability()
    assert any(int(a[3:]) <= major * 10 + minor for a in record["arch"])
    assert Path(record["path"]).parent == Path(pyg_dfgnn.__file__).parent
