"""The opcode -> kernel registry.

A kernel is registered as a *factory*: `factory(inst, ctx) -> fn`. The factory runs once when a
replica binds its executable; it reads the instruction's static attributes and shape and returns
`fn(*operand_values) -> value`, which the interpreter calls on every execution. Precompute
everything static in the factory: `fn` is the hot path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from replicas.hlo.ir import Computation, Instruction, Module
from replicas.name_table import registrar
from replicas.shapes import Shape

if TYPE_CHECKING:
    from replicas.transport.fabric import Fabric

Kernel = Callable[..., Any]


class KernelContext(Protocol):
    """What a kernel factory may ask of the replica it is bound for."""

    module: Module
    replica_id: int
    num_replicas: int
    fabric: Fabric  # the replica's fabric (collectives, channels, feeds); opaque to ops/

    def computation(self, name: str, donated: frozenset = frozenset(), *, scalars: frozenset[int] = frozenset()) -> Any:
        """The named computation compiled to `fn(*args) -> value`. Called with whole arrays where
        the computation is written for scalars, it evaluates element-wise (every op in a scalar
        computation is element-wise or broadcasts scalars). `donated`: the arguments it may
        overwrite; `scalars`: a While loop's state elements it takes as Python numbers (the
        result's `loop(body, state)` runs the loop)."""
        ...

    def computation_ir(self, name: str) -> Computation:
        ...

    def operand_shapes(self, inst: Instruction) -> list[Shape]:
        """The static shapes of `inst`'s operands (valid during the factory call)."""
        ...


KernelFactory = Callable[[Instruction, KernelContext], Kernel]

_REGISTRY: dict[str, KernelFactory] = {}


# `@kernel("add", "subtract")` registers a kernel factory for those opcodes.
kernel = registrar(_REGISTRY, "kernel")


def lookup(inst: Instruction) -> KernelFactory:
    try:
        return _REGISTRY[inst.opcode]
    except KeyError:
        raise inst.error(f"no kernel for opcode {inst.opcode!r}") from None


def registered_opcodes() -> frozenset[str]:
    return frozenset(_REGISTRY)


def dimension_list(inst: Instruction, name: str) -> list[int]:
    """The attribute `name` as dimension numbers (the shape rule checked them: distinct, in range)."""
    return [int(d) for d in inst.attrs.get(name) or []]
