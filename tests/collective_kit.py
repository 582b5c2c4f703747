"""Build small multi-replica programs straight from the IR and run them on threads (no Ray)."""

from __future__ import annotations

from typing import Any

import numpy as np

import replicas.channels.feeds  # noqa: F401  (registers infeed/outfeed)
import replicas.channels.send_recv  # noqa: F401  (registers send/recv kernels)
import replicas.collectives.kernels  # noqa: F401  (registers the collective kernels)
from replicas.hlo.ir import Computation, Instruction, Module
from replicas.runtime.compile import compile_module
from replicas.runtime.driver import launch, run
from replicas.runtime.job import Job
from replicas.shapes import Shape


def S(text: str) -> Shape:
    return Shape.parse(text)


class Comp:
    """A computation written instruction by instruction: `c.op(...)` returns the new name."""

    def __init__(self, name: str) -> None:
        self.comp = Computation(name)
        self._params = 0
        self._n = 0

    def param(self, shape: Shape | str, name: str | None = None) -> str:
        shape = S(shape) if isinstance(shape, str) else shape
        name = name or f"p{self._params}"
        self.comp.add(Instruction(name, "parameter", shape, [], {"parameter_number": self._params}))
        self._params += 1
        return name

    def op(self, opcode: str, shape: Shape | str, operands: list[str] = (), name: str | None = None,
           **attrs: Any) -> str:
        shape = S(shape) if isinstance(shape, str) else shape
        self._n += 1
        name = name or f"{opcode.replace('-', '_')}.{self._n}"
        self.comp.add(Instruction(name, opcode, shape, list(operands), attrs))
        return name

    def shape(self, name: str) -> Shape:
        return self.comp.instruction(name).shape

    def done(self, root: str) -> Computation:
        self.comp.root = root
        return self.comp


def module(entry: Computation, *others: Computation, **attrs: Any) -> Module:
    m = Module("test", attrs=dict(attrs))
    for c in others:
        m.add(c)
    m.add(entry)
    m.entry = entry.name
    return m


def reducer(opcode: str, element_type: str, name: str | None = None) -> Computation:
    c = Comp(name or f"{opcode}_{element_type}")
    a = c.param(Shape.scalar(element_type), "a")
    b = c.param(Shape.scalar(element_type), "b")
    return c.done(c.op(opcode, Shape.scalar(element_type), [a, b], name="r"))


def launch_threads(m: Module, args: Any, n: int, **kwargs: Any) -> Job:
    kwargs.setdefault("timeout", 60)
    return launch(compile_module(m), args, n, backend="threads", **kwargs)


def run_threads(m: Module, args: Any, n: int, **kwargs: Any) -> list[Any]:
    """Run to completion; nothing but the preloaded infeed comes from the host."""
    kwargs.setdefault("timeout", 60)
    return run(compile_module(m), args, n, backend="threads", **kwargs)


def one_op(opcode: str, result: str | Shape, operand_shapes: list[str | Shape], computations: list[Computation] = (),
           **attrs: Any) -> Module:
    c = Comp("main")
    names = [c.param(s) for s in operand_shapes]
    root = c.op(opcode, result, names, name="coll", **attrs)
    return module(c.done(root), *computations)


def rand(shape: tuple[int, ...], dtype: Any, rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(-1000, 1000, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).tobytes()
