"""custom-call through an explicit registry of Python functions.

`register_custom_call(name, fn)` makes `custom_call_target="name"` call `fn(*operand_values)`; its
return value is the result (a numpy array of the result's shape, or a tuple for a tuple result).
A program can only name targets that were registered: it never names code to import. An unknown
target is a ProgramError naming it.

The annotation targets XLA leaves in programs (sharding, host-offloading markers) are built in and
pass their operand through: on one partition they do not change the value. Other modules add built-in
targets with `builtin_target` (jaxlib's LAPACK calls, XLA:CPU's TopK): factories like kernels'.

The registry is per process: a job running replicas in other processes must register the same
functions there (`registered_custom_calls()` lists them for shipping).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from replicas.errors import ProgramError
from replicas.hlo.ir import Instruction
from replicas.name_table import registrar
from replicas.ops.registry import KernelContext, KernelFactory, kernel
from replicas.shapes import TOKEN, Shape

CustomCallFunction = Callable[..., Any]

_CUSTOM_CALLS: dict[str, CustomCallFunction] = {}
_BUILTIN_TARGETS: dict[str, KernelFactory] = {}

# XLA annotations that do not change the value on one partition.
PASS_THROUGH_TARGETS = frozenset({
    "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "annotate_device_placement",
    "MoveToHost", "MoveToDevice", "LayoutConstraint",
})

# JAX's host callbacks (jax.debug.print, pure_callback, io_callback): the function lives in the JAX
# program that compiled the module; rp.jax binds it (replicas/jax/callbacks.py).
JAX_CALLBACK_TARGETS = frozenset({"xla_ffi_python_cpu_callback", "xla_python_cpu_callback"})


# `@builtin_target("lapack_sgetrf_ffi")` registers a kernel factory for custom calls naming that
# target (built in, not user code).
builtin_target = registrar(_BUILTIN_TARGETS, "built-in custom-call target")


def is_builtin_target(name: Any) -> bool:
    """True for a target whose kernel is built in (an annotation, a LAPACK call, TopK, ...): one that
    computes its result and returns, never user code that may wait."""
    return isinstance(name, str) and (name in PASS_THROUGH_TARGETS or name in _BUILTIN_TARGETS)


def register_custom_call(name: str, fn: CustomCallFunction) -> None:
    """Make `custom_call_target=name` call `fn(*operand_values) -> result`. Re-registering replaces.
    A function with a true `takes_replica` attribute is called `fn(replica_id, *operand_values)`."""
    if not isinstance(name, str) or not name:
        raise ProgramError(f"custom-call target name must be a non-empty string, got {name!r}")
    if not callable(fn):
        raise ProgramError(f"custom-call target {name!r}: {fn!r} is not callable")
    if name in PASS_THROUGH_TARGETS or name in _BUILTIN_TARGETS:
        raise ProgramError(f"custom-call target {name!r} is built in")
    _CUSTOM_CALLS[name] = fn


def unregister_custom_call(name: str) -> None:
    _CUSTOM_CALLS.pop(name, None)


def registered_custom_calls() -> dict[str, CustomCallFunction]:
    """A copy of the registry (name -> function)."""
    return dict(_CUSTOM_CALLS)


@kernel("custom-call")
def make_custom_call(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    target = inst.attrs.get("custom_call_target")
    if not isinstance(target, str):
        raise inst.error("missing attribute custom_call_target")
    shapes = ctx.operand_shapes(inst)
    if target in PASS_THROUGH_TARGETS:
        if len(shapes) != 1 or not shapes[0].compatible(inst.shape):
            raise inst.error(f"custom-call {target!r} passes one operand through unchanged; got operands "
                             f"({', '.join(map(str, shapes))}) for result {inst.shape} (SPMD partitioning is "
                             "not supported)")

        def pass_through(x: Any) -> Any:
            return x

        return pass_through
    builtin = _BUILTIN_TARGETS.get(target)
    if builtin is not None:
        return builtin(inst, ctx)
    fn = _CUSTOM_CALLS.get(target)
    if fn is None and target.startswith("xla.sdy."):
        raise inst.error(f"custom-call {target!r} is a marker of JAX's lowered SPMD modules: rp.run, rp.launch "
                         "and rp.check partition such modules (replicas.jax.partition_spmd_markers), and "
                         "rp.jax.run runs JAX functions directly")
    if fn is None:
        known = ", ".join(sorted(n for n in _CUSTOM_CALLS if not n.startswith("rp.jax."))) or "none registered"
        raise inst.error(
            f"custom-call {target!r} calls a Python function of the JAX program that compiled it (jax.debug.print, "
            "jax.debug.callback, pure_callback, io_callback), which HLO text does not hold: run the JAX function "
            "with rp.jax.run (or rp.jax.replicated) instead" if target in JAX_CALLBACK_TARGETS else
            f"unknown custom-call target {target!r} (known: {known}); register it with "
            "replicas.register_custom_call(name, fn)")
    result_shape = inst.shape
    replica = ctx.replica_id

    def custom_call(*args: Any) -> Any:
        # Looked up on every call: a pooled interpreter must call what is registered now.
        current = _CUSTOM_CALLS.get(target)
        if current is None:
            raise inst.error(f"custom-call target {target!r} is no longer registered")
        value = current(replica, *args) if getattr(current, "takes_replica", False) else current(*args)
        return _check_result(inst, target, result_shape, value)

    return custom_call


def _check_result(inst: Instruction, target: str, shape: Shape, value: Any) -> Any:
    if shape.is_tuple:
        if not isinstance(value, (tuple, list)) or len(value) != len(shape.tuple_shapes):
            raise inst.error(f"custom-call {target!r} must return a tuple of {len(shape.tuple_shapes)} values "
                             f"for {shape}, returned {type(value).__name__}")
        return tuple(_check_result(inst, target, s, v) for s, v in zip(shape.tuple_shapes, value))
    if shape.is_token:
        return TOKEN
    try:
        arr = value if isinstance(value, np.ndarray) and value.dtype == shape.dtype else np.asarray(value, shape.dtype)
    except (TypeError, ValueError) as e:
        raise inst.error(f"custom-call {target!r} returned a value that is not {shape}: {e}") from None
    if arr.shape != shape.dimensions:
        raise inst.error(f"custom-call {target!r} returned shape {list(arr.shape)}, the result is {shape}")
    return arr
