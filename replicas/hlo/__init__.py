"""The program: IR, builder, HLO text, msgpack serialization, verifier."""

from replicas.hlo.ir import Computation, Instruction, Module, make_window

__all__ = ["Computation", "Instruction", "Module", "make_window"]
