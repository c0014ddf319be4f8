"""Where the CUDA extension's build time goes: a clean build, timed.

Builds ``pyg_dfgnn._C`` from a source tree (the repository, or another checkout
given as ``--src``, for a before / after comparison) in a fresh temporary copy, with
``MAX_JOBS`` compile jobs, and reports

* the wall time of the build, its CPU time (all compile jobs together: the wall
  time a build with one job would take) and the size of the library,
* each object file's compile time (ninja's log: start and end of each job),
* nvcc's phases summed over the ``.cu`` files (``nvcc -time``: the host
  compiler's preprocessing and compile, ``cudafe++``, ``cicc``, ``ptxas``),
* with ``--trace``, the device compile time of each kernel instantiation
  (``nvcc --fdevice-time-trace``), the largest first.

Writes a JSON record (``--out``; GPU or CPU, torch, date, command, one row per
object file) and prints a table. Usage, from the repository root::

    python -m benchmarks.build_time --jobs 2 --out build_time.json
    python -m benchmarks.build_time --src /path/to/old/checkout --jobs 16

Needs a CUDA build of torch and a CUDA toolkit (``nvcc``); builds for
``--arch`` (``TORCH_CUDA_ARCH_LIST``), so it runs on a machine without a GPU.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import glob
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What a build reads of a source tree.
BUILD_INPUTS = ("setup.py", "pyproject.toml", "README.md", "cuda", "pyg_dfgnn")


def _copy_tree(src: Path, dst: Path) -> None:
    for name in BUILD_INPUTS:
        path = src / name
        if path.is_dir():
            shutil.copytree(path, dst / name, ignore=shutil.ignore_patterns(
                "__pycache__", "_C*.so", "_build_info.json"))
        elif path.exists():
            shutil.copy2(path, dst / name)


def _ninja_log(build: Path) -> list:
    """``[(object, seconds)]`` of the last build recorded in ninja's log."""
    logs = glob.glob(str(build / "build" / "temp*" / ".ninja_log"))
    rows = {}
    if logs:
        for line in Path(logs[0]).read_text().splitlines()[1:]:
            start, end, _, out, _ = line.split("\t")
            rows[os.path.relpath(out, str(build / "build"))] = (int(end) - int(start)) / 1e3
    return sorted(rows.items(), key=lambda kv: -kv[1])


def _nvcc_phases(path: Path) -> dict:
    """Seconds per nvcc phase summed over the files (``nvcc -time``'s CSV, in ms)."""
    total = defaultdict(float)
    if not path.exists():
        return {}
    for row in csv.reader(path.read_text().splitlines()):
        if len(row) < 8 or row[0].strip() in ("source file name", "/dev/null", ""):
            continue
        phase = re.sub(r"\s*\(.*\)", "", row[1].strip())
        if phase != "nvcc":
            total[phase] += float(row[6]) / 1e3
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))


def _instantiations(trace_dir: Path, top: int) -> list:
    """The ``top`` kernel instantiations by device compile time (``--trace``)."""
    per = defaultdict(float)
    for path in trace_dir.glob("*.json"):
        try:
            events = json.loads(path.read_text()).get("traceEvents", [])
        except ValueError:
            continue
        for e in events:
            name = e.get("args", {}).get("detail") or e.get("name", "")
            if e.get("ph") == "X" and e.get("name") in ("Function", "OptFunction",
                                                        "ptxas function", "CodeGen Function"):
                per[name] += e.get("dur", 0) / 1e6
    return sorted(per.items(), key=lambda kv: -kv[1])[:top]


def _children_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def build(src: Path, jobs: int, arch: str, trace: bool, keep: bool,
          inplace: bool = False) -> dict:
    r"""A clean build of ``src``'s extension with ``jobs`` compile jobs.

    Returns:
        ``{"wall_s", "cpu_s", "library_mb", "objects": [(name, s)], "phases": {phase: s},
        "instantiations": [(name, s)]}``. With ``inplace`` the library is copied
        into ``src/pyg_dfgnn`` (as ``setup.py build_ext --inplace`` would).

    Raises:
        RuntimeError: the build failed (the log's end in the message).
    """
    tmp = Path(tempfile.mkdtemp(prefix="dfgnn_build_"))
    try:
        _copy_tree(src, tmp)
        times = tmp / "nvcc_time.csv"
        flags = f"-time {times}"
        if trace:
            (tmp / "trace").mkdir()
            flags += " --fdevice-time-trace=-"
        env = {**os.environ, "MAX_JOBS": str(jobs), "TORCH_CUDA_ARCH_LIST": arch,
               "FORCE_CUDA": "1", "NVCC_APPEND_FLAGS": flags}
        env.pop("PYG_DFGNN_NO_EXT", None)
        t0 = time.perf_counter()
        cpu0 = _children_cpu()
        res = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tmp,
                             env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        cpu = _children_cpu() - cpu0
        if res.returncode != 0:
            raise RuntimeError(f"the build of {src} failed:\n{(res.stdout + res.stderr)[-4000:]}")
        libs = glob.glob(str(tmp / "pyg_dfgnn" / "_C*.so"))
        if inplace:
            shutil.copy2(libs[0], src / "pyg_dfgnn" / Path(libs[0]).name)
        if trace:  # nvcc names each trace after its object
            for path in glob.glob(str(tmp / "build" / "**" / "*.json"), recursive=True):
                shutil.move(path, tmp / "trace" / Path(path).name)
        return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                "library_mb": round(os.path.getsize(libs[0]) / 2**20, 1) if libs else None,
                "objects": [(n, round(s, 1)) for n, s in _ninja_log(tmp)],
                "phases": {k: round(v, 1) for k, v in _nvcc_phases(times).items()},
                "instantiations": ([(n, round(s, 2)) for n, s in _instantiations(tmp / "trace", 40)]
                                   if trace else [])}
    finally:
        if keep:
            print(f"kept the build in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _machine() -> dict:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"gpu": gpu, "cpu_cores": os.cpu_count(), "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "command": "python -m benchmarks.build_time " + " ".join(sys.argv[1:])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, action="append",
                    help="source tree to build (repeat to build several, one after "
                         "another; default: this repository)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count(), help="MAX_JOBS (default: "
                    "the cores)")
    ap.add_argument("--arch", default="9.0", help="TORCH_CUDA_ARCH_LIST (default: 9.0)")
    ap.add_argument("--trace", action="store_true",
                    help="also time each kernel instantiation (nvcc --fdevice-time-trace)")
    ap.add_argument("--keep", action="store_true", help="keep the build folder")
    ap.add_argument("--inplace", action="store_true",
                    help="copy each library into its tree's pyg_dfgnn/ (to run it there)")
    ap.add_argument("--out", default=None, help="JSON record")
    args = ap.parse_args(argv)
    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        print("benchmarks.build_time needs a CUDA toolkit (nvcc on PATH or CUDA_HOME).\n"
              "Install one whose major version matches torch's CUDA build.", file=sys.stderr)
        return 2
    record = {**_machine(), "jobs": args.jobs, "arch": args.arch, "rows": []}
    for src in args.src or [ROOT]:
        res = build(src.resolve(), args.jobs, args.arch, args.trace, args.keep, args.inplace)
        record["rows"].append({"src": str(src), **res})
        print(f"{src}: {res['wall_s']:.0f} s with {args.jobs} jobs ({res['cpu_s']:.0f} s of "
              f"CPU), library {res['library_mb']} MB")
        print("  slowest objects: " + ", ".join(f"{n.split('/')[-1]} {s:.0f} s"
                                                for n, s in res["objects"][:8]))
        print("  nvcc phases (s, summed over files): " + ", ".join(
            f"{k} {v:.0f}" for k, v in res["phases"].items()))
        for name, s in res["instantiations"][:10]:
            print(f"  {s:7.2f} s  {name[:150]}")
        if args.out:
            Path(args.out).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
