"""Numpy kernels, one module per op family, and the opcode -> kernel registry.

Importing this package registers every kernel family. `ops` knows nothing of Ray or replicas.
"""

import importlib
import pkgutil

from replicas.ops.registry import KernelContext, kernel, lookup, registered_opcodes

for _info in pkgutil.iter_modules(__path__):
    if _info.name not in ("registry", "recognize"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["KernelContext", "kernel", "lookup", "registered_opcodes"]
