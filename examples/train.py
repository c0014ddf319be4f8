"""Train a 2-layer attention GNN on Cora with PyG's native convs and with the fused
pyg_dfgnn convs; print test accuracy, median epoch time and the speedup.

    python examples/train.py                          # GT (TransformerConv), both impls
    python examples/train.py --model gat --impl fused
    python examples/train.py --help

The logic lives in :mod:`pyg_dfgnn.train` (also ``python -m pyg_dfgnn train``).
"""
import sys
from pathlib import Path

try:
    from pyg_dfgnn.train import cli
except ImportError:  # running from a source checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pyg_dfgnn.train import cli

if __name__ == "__main__":
    sys.exit(cli(prog="examples/train.py"))
