"""The one vocabulary of HLO opcodes: one record per opcode, spelled as in HLO text.

Every other opcode set in the package is derived from `OPCODES`: the parser's known opcodes, the
schedule's side-effecting opcodes, the collectives, the verifier's grouped/paired/-done tables.
`family` names the module of `replicas/ops/` (or `collectives`, `channels`) holding the kernel, and
the module of `hlo/shape_inference/` and `hlo/builder/` holding its shape rule and builder method.
An opcode with `supported=False` parses, but the verifier refuses it (no kernel runs it yet).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Grouping = Literal["groups", "pairs"]


@dataclass(frozen=True)
class Opcode:
    name: str
    family: str
    arity: int | None  # operand count; None when variadic (the shape rule checks the count)
    side_effect: bool = False  # keeps its program order; never dropped from a schedule
    collective: bool = False  # starts communication between replicas over replica groups or pairs
    grouping: Grouping | None = None  # replica_groups, or source_target_pairs
    # With a channel_id (and no global ids) these group partitions, not replicas (XLA's kCrossPartition).
    channel_groups_partitions: bool = False
    done_of: tuple[str, ...] = ()  # for a -done (or -update) op: the opcodes whose context it consumes
    supported: bool = True  # False: parses, the verifier refuses it as unsupported


def _ops(family: str, arity: int | None, *names: str, **flags: object) -> list[Opcode]:
    return [Opcode(name, family, arity, **flags) for name in names]  # type: ignore[arg-type]


_ALL_REDUCE = dict(side_effect=True, collective=True, grouping="groups")
_ALL_TO_ALL = dict(side_effect=True, collective=True, grouping="groups", channel_groups_partitions=True)
_PERMUTE = dict(side_effect=True, collective=True, grouping="pairs", channel_groups_partitions=True)

_TABLE: list[Opcode] = [
    *_ops("elementwise_unary", 1, "abs", "cbrt", "ceil", "cosine", "count-leading-zeros", "erf", "exponential",
          "exponential-minus-one", "floor", "imag", "is-finite", "log", "log-plus-one", "logistic", "negate",
          "not", "popcnt", "real", "round-nearest-afz", "round-nearest-even", "rsqrt", "sign", "sine", "sqrt",
          "tan", "tanh",
          # Not XLA HLO opcodes: CHLO's inverse trigonometric and hyperbolic functions, as JAX lowers them.
          "acos", "acosh", "asin", "asinh", "atan", "atanh", "cosh", "sinh"),
    *_ops("elementwise_binary", 2, "add", "and", "atan2", "complex", "divide", "maximum", "minimum", "multiply",
          "or", "power", "remainder", "shift-left", "shift-right-arithmetic", "shift-right-logical", "subtract",
          "xor", "mulhi"),
    *_ops("compare", 2, "compare"),
    *_ops("select", 3, "select", "clamp"),
    *_ops("convert", 1, "convert", "bitcast-convert", "reduce-precision"),
    Opcode("stochastic-convert", "stochastic_convert", 2),
    *_ops("constants", 0, "constant"),
    *_ops("constants", 0, "parameter"),
    *_ops("shape_ops", 0, "iota"),
    *_ops("shape_ops", 1, "broadcast", "reshape", "bitcast", "copy", "transpose", "reverse"),
    Opcode("dynamic-reshape", "dynamic_reshape", None),
    *_ops("slicing", 1, "slice"),
    *_ops("slicing", 2, "pad"),
    *_ops("slicing", None, "dynamic-slice", "dynamic-update-slice", "concatenate"),
    *_ops("dynamic_shapes", 1, "get-dimension-size"),
    *_ops("dynamic_shapes", 2, "set-dimension-size"),
    *_ops("gather", 2, "gather"),
    *_ops("scatter", None, "scatter"),
    *_ops("dot", 2, "dot"),
    *_ops("convolution", 2, "convolution"),
    *_ops("fft", 1, "fft"),
    *_ops("linalg", 1, "cholesky"),
    *_ops("linalg", 2, "triangular-solve"),
    *_ops("batch_norm", 3, "batch-norm-training"),
    *_ops("batch_norm", 5, "batch-norm-inference", "batch-norm-grad"),
    *_ops("reduce", None, "reduce"),
    *_ops("reduce_window", None, "reduce-window"),
    *_ops("reduce_window", 3, "select-and-scatter"),
    *_ops("sort", None, "sort"),
    Opcode("topk", "topk", 1),
    *_ops("control_flow", None, "call", "fusion", "conditional", "map"),
    *_ops("control_flow", 1, "while"),
    Opcode("scan", "control_flow", None, supported=False),  # XLA's newer scan(inputs..., inits...)
    Opcode("async-start", "control_flow", None, side_effect=True),
    Opcode("async-update", "control_flow", 1, side_effect=True, done_of=("async-start", "async-update")),
    Opcode("async-done", "control_flow", 1, side_effect=True, done_of=("async-start", "async-update")),
    *_ops("tuples", None, "tuple"),
    *_ops("tuples", 1, "get-tuple-element", "domain", "copy-start", "opt-barrier"),
    Opcode("copy-done", "tuples", 1, done_of=("copy-start",)),
    *_ops("tuples", 2, "add-dependency"),
    Opcode("after-all", "tuples", None, side_effect=True),
    *_ops("rng", None, "rng", side_effect=True),  # (a, b) and an optional result-shape operand
    *_ops("rng", 1, "rng-bit-generator"),
    Opcode("rng-get-and-update-state", "rng", 0, side_effect=True),
    Opcode("custom-call", "custom_call", None, side_effect=True),
    # Collectives (replicas/collectives/kernels.py).
    *_ops("collectives", None, "all-reduce", "all-reduce-start", "all-gather", "all-gather-start", "reduce-scatter",
          **_ALL_REDUCE),
    *_ops("collectives", None, "all-to-all", "collective-broadcast", **_ALL_TO_ALL),
    # One operand; XLA also writes combined (several) and in-place (4) forms: the shape rule names them.
    *_ops("collectives", None, "collective-permute", "collective-permute-start", **_PERMUTE),
    Opcode("ragged-all-to-all", "collectives", 6, side_effect=True, collective=True, grouping="groups",
           channel_groups_partitions=True),
    Opcode("all-reduce-done", "collectives", 1, side_effect=True, done_of=("all-reduce-start",)),
    Opcode("all-gather-done", "collectives", 1, side_effect=True, done_of=("all-gather-start",)),
    Opcode("collective-permute-done", "collectives", 1, side_effect=True, done_of=("collective-permute-start",)),
    # XLA has no collective-broadcast-start; a -done is refused until a start exists to pair it with.
    Opcode("collective-broadcast-done", "collectives", 1, side_effect=True, supported=False),
    *_ops("collectives", 0, "replica-id", "partition-id"),
    # Channels and feeds (replicas/channels/).
    Opcode("send", "channels", 2, side_effect=True),
    Opcode("send-done", "channels", 1, side_effect=True, done_of=("send",)),
    Opcode("recv", "channels", 1, side_effect=True),
    Opcode("recv-done", "channels", 1, side_effect=True, done_of=("recv",)),
    Opcode("infeed", "channels", 1, side_effect=True),
    Opcode("outfeed", "channels", 2, side_effect=True),
]

OPCODES: dict[str, Opcode] = {}
for _op in _TABLE:
    if _op.name in OPCODES:
        raise RuntimeError(f"opcode {_op.name!r} listed twice")
    OPCODES[_op.name] = _op

KNOWN_OPCODES = frozenset(OPCODES)
SIDE_EFFECT_OPCODES = frozenset(op.name for op in _TABLE if op.side_effect)
GROUPED_OPCODES = frozenset(op.name for op in _TABLE if op.grouping == "groups")
PAIRED_OPCODES = frozenset(op.name for op in _TABLE if op.grouping == "pairs")
DONE_OF = {op.name: op.done_of for op in _TABLE if op.done_of}
UNSUPPORTED_OPCODES = frozenset(op.name for op in _TABLE if not op.supported)
# Run by the interpreter itself, not by a kernel.
INTERPRETER_OPCODES = frozenset({"parameter"})


def opcode(name: str) -> Opcode | None:
    return OPCODES.get(name)
