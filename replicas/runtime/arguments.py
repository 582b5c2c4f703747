"""Checks of what a caller passes to `rp.run` / `rp.launch`, before anything starts or allocates.

Each bad value is a ProgramError naming the argument; nothing a caller passes escapes as a
TypeError, AttributeError, KeyError or FileNotFoundError from deep inside the runtime.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from replicas.caching import Cache
from replicas.errors import ProgramError
from replicas.hlo.ir import Computation, Instruction
from replicas.limits import check_replicas, is_integer, short_text
from replicas.shapes import Shape, Token


def _type(value: Any) -> str:
    return type(value).__name__


def check_module_argument(module: Any) -> None:
    from replicas.hlo.ir import Module
    from replicas.runtime.compile import Executable

    if not isinstance(module, (Module, Executable)):
        hint = " (read a file with rp.load(path))" if isinstance(module, (str, os.PathLike)) else ""
        raise ProgramError(f"module must be a replicas Module or Executable{hint}, got {_type(module)}")


def check_args_container(args: Any) -> list[Any] | None:
    """`args` as a list: one list of values for every replica, or one list per replica."""
    if args is None:
        return None
    if isinstance(args, (str, bytes, Mapping, np.ndarray)) or not hasattr(args, "__iter__"):
        hint = "; wrap a single value as [x]" if isinstance(args, np.ndarray) else ""
        raise ProgramError(f"args must be a list of argument values (or one list per replica), "
                           f"got {_type(args)}{hint}")
    try:
        return list(args)
    except Exception as e:  # noqa: BLE001 - an iterable that fails while iterated
        raise ProgramError(f"args could not be read as a list: {type(e).__name__}: {e}") from None


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float, np.integer, np.floating))
            and not isinstance(value, (bool, np.bool_)))


def check_timeout(value: Any, what: str = "timeout") -> None:
    if value is None:
        return
    if not _is_number(value) or math.isnan(value) or value <= 0:
        raise ProgramError(f"{what} must be a positive number of seconds or None, got {short_text(repr(value))}")


def check_trace_path(trace: Any) -> None:
    """The trace file can be created: its directory exists and is writable (checked before the job
    starts, so a bad path never costs a job's results)."""
    if trace is None:
        return
    if not isinstance(trace, (str, os.PathLike)):
        raise ProgramError(f"trace must be a file path, got {_type(trace)}")
    path = Path(trace)
    directory = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ProgramError(f"trace={str(trace)!r} is a directory; give a file name")
    if not directory.is_dir():
        raise ProgramError(f"trace={str(trace)!r}: directory {str(directory)!r} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ProgramError(f"trace={str(trace)!r}: directory {str(directory)!r} is not writable")


def check_launch_options(*, num_replicas: Any, timeout: Any, infeed: Any, trace: Any, strict: Any,
                         backend: Any, replicas_per_actor: Any, resources: Any, address: Any) -> int:
    """Every option of `launch` but the module and args; returns num_replicas as an int."""
    n = check_replicas(num_replicas)
    check_timeout(timeout)
    if not isinstance(strict, (bool, np.bool_)):
        raise ProgramError(f"strict must be True or False, got {_type(strict)}")
    if not isinstance(backend, str):
        raise ProgramError(f"backend must be a string, got {_type(backend)}")
    if address is not None and not isinstance(address, str):
        raise ProgramError(f"address must be a string or None, got {_type(address)}")
    if replicas_per_actor is not None and (not is_integer(replicas_per_actor) or replicas_per_actor < 0):
        raise ProgramError(f"replicas_per_actor must be a positive integer or None, "
                           f"got {short_text(repr(replicas_per_actor))}")
    if infeed is not None:
        if isinstance(infeed, (str, bytes, Mapping, np.ndarray)) or not hasattr(infeed, "__len__"):
            raise ProgramError(f"infeed must be a list with one list of values per replica, got {_type(infeed)}")
        for r, values in enumerate(infeed):
            if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__iter__"):
                raise ProgramError(f"infeed[{r}] must be a list of values for replica {r}, got {_type(values)}")
    if resources is not None:
        if isinstance(resources, (str, bytes, Mapping)) or not hasattr(resources, "__len__"):
            raise ProgramError(f"resources must be a list with one dict per replica, got {_type(resources)}")
        for r, request in enumerate(resources):
            if request is None:
                continue
            if not isinstance(request, Mapping):
                raise ProgramError(f"resources[{r}] must be a dict of resource name -> amount, got {_type(request)}")
            for name, amount in request.items():
                if not isinstance(name, str) or not _is_number(amount) or not amount >= 0:
                    raise ProgramError(f"resources[{r}]: {short_text(repr(name))}: {short_text(repr(amount))} "
                                       "must be a resource name and a non-negative amount")
    check_trace_path(trace)
    return n


# -- the entry computation's arguments ------------------------------------------------------------

def check_arguments(entry: Computation, args: Sequence[Any], params: list[Instruction] | None = None) -> list[Any]:
    """Check (and convert Python scalars/lists to) the entry parameters' shapes and dtypes
    (`params`: `entry.parameters`, when the caller keeps them)."""
    if params is None:
        params = entry.parameters
    if len(args) != len(params):
        raise ProgramError(f"entry computation {entry.name} takes {len(params)} arguments "
                           f"({', '.join(str(p.shape) for p in params)}), got {len(args)}")
    checked = []
    for p, a in zip(params, args):
        if type(a) is np.ndarray:  # the usual argument, checked without naming it first
            static = _STATIC.get(p.shape)
            if static is not None and a.shape == static[1] and a.dtype == static[0]:
                checked.append(a)
                continue
        checked.append(_check_value(p.shape, a, f"argument {p.attrs['parameter_number']} (%{p.name})"))
    return checked


# id(shape) -> (shape, dtype, dimensions) of a static array shape: the check of an argument that
# is already a numpy array of exactly that type and shape (the usual case) is two comparisons.
_STATIC: Cache[tuple[np.dtype, tuple[int, ...]]] = Cache("static argument shapes", 4096, by_identity=True)


def _check_value(shape: Shape, value: Any, what: str) -> Any:
    if type(value) is np.ndarray:
        static = _STATIC.get(shape)
        if static is not None and value.shape == static[1] and value.dtype == static[0]:
            return value
        if not (shape.is_tuple or shape.is_token or any(shape.dynamic)):
            _STATIC.put(shape, (shape.dtype, tuple(shape.dimensions)))
    if shape.is_tuple:
        if not isinstance(value, (tuple, list)) or len(value) != len(shape.tuple_shapes):
            raise ProgramError(f"{what}: expected a tuple {shape}, got {_describe(value)}")
        return tuple(_check_value(s, v, f"{what}[{i}]")
                     for i, (s, v) in enumerate(zip(shape.tuple_shapes, value)))
    if shape.is_token:
        if not isinstance(value, Token):
            raise ProgramError(f"{what}: expected a token, got {_describe(value)}")
        return value
    if isinstance(value, np.ndarray):
        if value.dtype != shape.dtype:
            raise ProgramError(f"{what}: expected {shape}, got dtype {value.dtype} "
                               f"(XLA type {shape.element_type.value} is numpy {shape.dtype})")
        arr = value
    elif isinstance(value, (int, float, complex, bool, list, np.generic)):
        if isinstance(value, list) and len(value) != (shape.dimensions[0] if shape.dimensions else -1):
            # Checked before converting: a long list for a small shape never becomes an array.
            raise ProgramError(f"{what}: expected {shape}, got a list of {len(value)}")
        try:
            arr = np.asarray(value, dtype=shape.dtype)
        except Exception as e:  # noqa: BLE001 - an element's own __array__ / __float__ may raise anything
            raise ProgramError(f"{what}: cannot convert {_describe(value)} to {shape}: "
                               f"{type(e).__name__}: {e}") from None
    else:
        raise ProgramError(f"{what}: expected a numpy array {shape}, got {_describe(value)}")
    dims = shape.dimensions
    ok = arr.ndim == len(dims) and all(
        (n <= d if dyn else n == d) for n, d, dyn in zip(arr.shape, dims, shape.dynamic))
    if not ok:
        raise ProgramError(f"{what}: expected shape {shape}, got {arr.dtype}{list(arr.shape)}")
    return arr


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"array {value.dtype}{list(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


__all__ = ["check_module_argument", "check_args_container", "check_timeout", "check_trace_path",
           "check_launch_options", "check_arguments"]
