"""Smoke test of an installed pyg_dfgnn wheel, run from a folder outside the
repository (so only the installed copy can be imported).

Imports every module of the package, runs each fused layer forward and backward
on a small random graph against its PyG parent (same parameters), and runs
``python -m pyg_dfgnn info``. ``--expect-extension`` also requires the wheel's
compiled ``_C`` to load. Exits non-zero on the first failure.
"""
import argparse
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import torch

# Modules that the package imports only once the extension has loaded (fakes of
# its operators, its direct entry).
EXTENSION_ONLY = {"pyg_dfgnn.ops._fakes", "pyg_dfgnn.ops.direct"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--expect-extension", action="store_true",
                        help="fail unless the installed pyg_dfgnn._C loads")
    parser.add_argument("--forbid", type=Path, required=True,
                        help="the source checkout: the import must not come from it")
    args = parser.parse_args()

    import pyg_dfgnn
    from pyg_dfgnn import extension

    where = Path(pyg_dfgnn.__file__).resolve().parent
    if args.forbid.resolve() in where.parents:
        raise SystemExit(f"pyg_dfgnn was imported from the checkout ({where}), not the wheel")
    skip = {"pyg_dfgnn.__main__"} | (set() if extension.HAS_EXTENSION else EXTENSION_ONLY)
    names = [m.name for m in pkgutil.walk_packages(pyg_dfgnn.__path__, "pyg_dfgnn.")
             if m.name not in skip]
    for name in names:
        importlib.import_module(name)
    print(f"imported {len(names)} modules from {where}")
    if args.expect_extension and not extension.HAS_EXTENSION:
        raise SystemExit(f"the wheel's extension does not load: {extension.load_error()}")

    from torch_geometric.nn import AGNNConv

    from pyg_dfgnn.nn._common import FUSED

    torch.manual_seed(0)
    n, f = 40, 16
    x = torch.randn(n, f, dtype=torch.float64, requires_grad=True)
    edge_index = torch.randint(0, n, (2, 160))
    for native_cls, fused_cls in FUSED.items():
        kwargs = {} if native_cls is AGNNConv else {"in_channels": f, "out_channels": 8,
                                                    "heads": 2}
        native = native_cls(**kwargs).double()
        fused = fused_cls(**kwargs).double()
        fused.load_state_dict(native.state_dict())
        reason = fused.fallback_reason(x, edge_index)
        if reason:
            raise SystemExit(f"{fused_cls.__name__} does not run fused: {reason}")
        out = fused(x, edge_index)
        (grad,) = torch.autograd.grad(out.square().sum(), x)
        ref = native(x, edge_index)
        (ref_grad,) = torch.autograd.grad(ref.square().sum(), x)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(grad, ref_grad)
        print(f"{fused_cls.__name__}: forward and backward match {native_cls.__name__}")

    info = subprocess.run([sys.executable, "-m", "pyg_dfgnn", "info"], capture_output=True,
                          text=True, timeout=300)
    print(info.stdout, end="")
    if info.returncode != 0:
        raise SystemExit(f"python -m pyg_dfgnn info failed:\n{info.stderr}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
