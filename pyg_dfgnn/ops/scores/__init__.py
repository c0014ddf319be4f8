r"""The score functions' specs and public ops, one module each, registered on
import: every module in this package is imported here, so a new score needs no
edit outside its own files (:mod:`pyg_dfgnn.ops.spec`).

Each module defines its :class:`~pyg_dfgnn.ops.spec.ScoreSpec`, registers it, and
lists its public ops in ``__all__``; :data:`OPS` collects them and :data:`BY_SCORE`
maps a score's name to its op (:func:`pyg_dfgnn.ops.fused_attention`).
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Dict

#: Public op name -> function, from every score module's ``__all__``.
OPS: Dict[str, Callable] = {}
#: Score name -> its public op (the module's ``SCORE_OP``).
BY_SCORE: Dict[str, Callable] = {}

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    _mod = importlib.import_module(f"{__name__}.{_info.name}")
    OPS.update({name: getattr(_mod, name) for name in getattr(_mod, "__all__", ())})
    BY_SCORE[_mod.SPEC.name] = _mod.SCORE_OP
