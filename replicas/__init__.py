"""replicas: run one XLA program on N replicas (Ray actors), with XLA's collectives, channels
and feeds, and no silent hangs.

    import replicas as rp
    y = rp.jax.run(f, x, num_replicas=4, in_specs=..., out_specs=...)  # a JAX function: global results
    out = rp.run("program.hlo", args)      # a path, HLO text, a Module: one result per replica
"""

from __future__ import annotations

import importlib
from typing import Any

from replicas import shapes
from replicas.errors import (
    CollectiveMismatchError,
    DeadlockError,
    ExecutionTimeout,
    ProgramError,
    ReplicaDivergenceError,
    ReplicaFailure,
    ReplicasError,
)
from replicas.hlo.ir import Computation, Instruction, Module
from replicas.shapes import TOKEN, Layout, PrimitiveType, Shape

__version__ = "0.1.0"

# Heavier parts load on first use, so `import replicas` stays cheap (Ray actors import it too).
_LAZY = {
    "parse_hlo": "replicas.hlo.text",
    "load": "replicas.hlo.files",
    "save": "replicas.hlo.files",
    "XlaBuilder": "replicas.hlo.builder",
    "XlaOp": "replicas.hlo.builder",
    "verify": "replicas.hlo.verify",
    "compile_module": "replicas.runtime.compile",
    "Executable": "replicas.runtime.compile",
    "Interpreter": "replicas.runtime.interpreter",
    "evaluate": "replicas.runtime.interpreter",
    "run": "replicas.runtime.driver",
    "launch": "replicas.runtime.driver",
    "Job": "replicas.runtime.job",
    "Array": "replicas.runtime.resident",
    "register_custom_call": "replicas.ops.custom_call",
    "unregister_custom_call": "replicas.ops.custom_call",
    "check": "replicas.checker",
    "jax": ("replicas.jax", None),
    # What users receive: the reports carried by errors, the replicas' published states.
    "Report": "replicas.diagnostics.report",
    "MismatchReport": "replicas.collectives.mismatch",
    "Edge": "replicas.diagnostics.report",
    "ReplicaState": "replicas.records",
    "BlockInfo": "replicas.records",  # the module itself; imports JAX only when used
}


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'replicas' has no attribute {name!r}")
    module_name, attr = target if isinstance(target, tuple) else (target, name)
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


__all__ = [
    "CollectiveMismatchError", "Computation", "DeadlockError", "ExecutionTimeout", "Instruction", "Layout",
    "Module", "PrimitiveType", "ProgramError", "ReplicaDivergenceError", "ReplicaFailure", "ReplicasError", "Shape",
    "TOKEN", "shapes",
    *_LAZY,
]
