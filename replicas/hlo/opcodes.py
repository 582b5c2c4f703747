"""The one table of HLO opcodes the text parser accepts (spelled as in HLO text).

Knowing an opcode here means the text loads; whether a kernel exists is the runtime's business.
"""

from __future__ import annotations

_ELEMENTWISE_UNARY = (
    "abs", "cbrt", "ceil", "cosine", "count-leading-zeros", "erf", "exponential", "exponential-minus-one",
    "floor", "imag", "is-finite", "log", "log-plus-one", "logistic", "negate", "not", "popcnt", "real",
    "round-nearest-afz", "round-nearest-even", "rsqrt", "sign", "sine", "sqrt", "tan", "tanh",
)
_ELEMENTWISE_BINARY = (
    "add", "and", "atan2", "complex", "divide", "maximum", "minimum", "multiply", "or", "power", "remainder",
    "shift-left", "shift-right-arithmetic", "shift-right-logical", "subtract", "xor",
)
_OTHER = (
    "add-dependency", "after-all", "all-gather", "all-gather-done", "all-gather-start", "all-reduce",
    "all-reduce-done", "all-reduce-start", "all-to-all", "async-done", "async-start", "async-update",
    "batch-norm-grad", "batch-norm-inference", "batch-norm-training", "bitcast", "bitcast-convert", "broadcast",
    "call", "cholesky", "clamp", "collective-broadcast", "collective-permute", "collective-permute-done",
    "collective-permute-start", "compare", "concatenate", "conditional", "constant", "convert", "convolution",
    "copy", "copy-done", "copy-start", "custom-call", "domain", "dot", "dynamic-reshape", "dynamic-slice",
    "dynamic-update-slice", "fft", "fusion", "gather", "get-dimension-size", "get-tuple-element", "infeed",
    "iota", "map", "opt-barrier", "outfeed", "pad", "parameter", "partition-id", "ragged-all-to-all", "recv",
    "recv-done", "reduce", "reduce-precision", "reduce-scatter", "reduce-window", "replica-id", "reshape",
    "reverse", "rng", "rng-bit-generator", "rng-get-and-update-state", "scatter", "select", "select-and-scatter",
    "send", "send-done", "set-dimension-size", "slice", "sort", "stochastic-convert", "topk", "transpose",
    "triangular-solve", "tuple", "while",
)

ELEMENTWISE_UNARY_OPCODES = frozenset(_ELEMENTWISE_UNARY)
ELEMENTWISE_BINARY_OPCODES = frozenset(_ELEMENTWISE_BINARY)
KNOWN_OPCODES = frozenset(_ELEMENTWISE_UNARY + _ELEMENTWISE_BINARY + _OTHER)


def is_known_opcode(opcode: str) -> bool:
    return opcode in KNOWN_OPCODES
