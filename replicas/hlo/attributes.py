"""HLO text attributes: the value syntax of each attribute name, both ways (text <-> IR value).

Every attribute the parser keeps is listed in `SPECS` (text name -> IR name, parser, printer);
attributes that never change what a program computes are in `DROPPED`. Anything else is an
unknown attribute that might change meaning, and the parser rejects it.
Value parsers take the raw value text and raise ValueError on bad syntax (the caller adds the
position).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from replicas.hlo.lexer import Scanner, quote
from replicas.hlo.replica_groups import format_replica_groups, parse_int_groups, parse_replica_groups
from replicas.hlo.replica_groups import ints as _ints
from replicas.hlo.window import make_window
from replicas.shapes import Shape

_INT = re.compile(r"-?[0-9]+")
_WORD = re.compile(r"[A-Za-z0-9_?.\-]+(?:->[A-Za-z0-9_?]+)?")
_SLICES = re.compile(r"\{\s*(?:\[[^\[\]]*\](?:\s*,\s*\[[^\[\]]*\])*+)?\s*\}")
_SLICE = re.compile(r"\[([^\[\]]*)\]")
_COMP_NAME = re.compile(r"%?([A-Za-z_][A-Za-z0-9_.\-]*)")

# -- value parsers ---------------------------------------------------------------------------------


def parse_int(raw: str) -> int:
    if not _INT.fullmatch(raw):
        raise ValueError("expected an integer")
    return int(raw)


def _parse_float(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError("expected a number") from None


def _parse_bool(raw: str) -> bool:
    if raw == "true":
        return True
    if raw == "false":
        return False
    raise ValueError("expected true or false")


def _parse_word(raw: str) -> str:
    if not _WORD.fullmatch(raw):
        raise ValueError("expected a bare word")
    return raw


def _enum(*allowed: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return raw
    return parse


def _parse_string(raw: str) -> str:
    scanner = Scanner(raw)
    value = scanner.string()
    if not scanner.at_end():
        raise ValueError("unexpected text after the string")
    return value


def parse_int_list(raw: str) -> list[int]:
    if not (raw.startswith("{") and raw.endswith("}")):
        raise ValueError("expected {i,j,...}")
    return _ints(raw[1:-1])


def _parse_slice_sizes(raw: str) -> list[int] | list[list[int]]:
    """gather's {i,j,...}, or an in-place collective-permute's {{i,j},...} (one list per slice)."""
    return parse_int_groups(raw) if raw.replace(" ", "").startswith("{{") else parse_int_list(raw)


def _parse_pairs(raw: str) -> list[tuple[int, int]]:
    pairs = []
    for group in parse_int_groups(raw):
        if len(group) != 2:
            raise ValueError(f"a source-target pair has two entries, got {group}")
        pairs.append((group[0], group[1]))
    return pairs


def _parse_slice(raw: str) -> list[tuple[int, int, int]]:
    if not _SLICES.fullmatch(raw):
        raise ValueError("expected {[start:limit:stride], ...}")
    ranges = []
    for body in _SLICE.findall(raw):
        parts = [p.strip() for p in body.split(":")]
        if len(parts) not in (2, 3) or not all(_INT.fullmatch(p) for p in parts):
            raise ValueError(f"bad slice range [{body}]")
        start, limit = int(parts[0]), int(parts[1])
        ranges.append((start, limit, int(parts[2]) if len(parts) == 3 else 1))
    return ranges


def _parse_padding(raw: str) -> list[tuple[int, int, int]]:
    if not raw:
        return []
    config = []
    for dim in raw.split("x"):
        parts = dim.split("_")
        if len(parts) not in (2, 3) or not all(_INT.fullmatch(p) for p in parts):
            raise ValueError(f"bad padding {dim!r} (lo_hi or lo_hi_interior)")
        config.append((int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) == 3 else 0))
    return config


def _dxd(value: str) -> list[int]:
    parts = value.split("x")
    if not all(_INT.fullmatch(p) for p in parts):
        raise ValueError(f"bad window field value {value!r}")
    return [int(p) for p in parts]


def _parse_window(raw: str) -> dict[str, Any]:
    if not (raw.startswith("{") and raw.endswith("}")):
        raise ValueError("expected window={size=... stride=...}")
    fields: dict[str, Any] = {}
    for item in raw[1:-1].split():
        key, eq, value = item.partition("=")
        if not eq or key in fields:
            raise ValueError(f"bad window field {item!r}")
        if key == "pad":
            pads = []
            for p in value.split("x"):
                lo_hi = p.split("_")
                if len(lo_hi) != 2 or not all(_INT.fullmatch(v) for v in lo_hi):
                    raise ValueError(f"bad window pad {p!r}")
                pads.append((int(lo_hi[0]), int(lo_hi[1])))
            fields["pad"] = pads
        elif key == "rhs_reversal":
            fields["window_reversal"] = [bool(v) for v in _dxd(value)]
        elif key in ("size", "stride", "lhs_dilate", "rhs_dilate"):
            fields[key] = _dxd(value)
        else:
            raise ValueError(f"unknown window field {key!r}")
    ranks = {len(v) for v in fields.values()}
    if len(ranks) > 1:
        raise ValueError("window fields have different numbers of dimensions")
    return make_window(ranks.pop() if ranks else 0, **fields)


def _parse_computation(raw: str) -> str:
    m = _COMP_NAME.fullmatch(raw)
    if m is None:
        raise ValueError("expected a computation name")
    return m.group(1)


def _parse_computation_list(raw: str) -> list[str]:
    if not (raw.startswith("{") and raw.endswith("}")):
        raise ValueError("expected {%comp, ...}")
    body = raw[1:-1].strip()
    return [_parse_computation(p.strip()) for p in body.split(",")] if body else []


def parse_frontend_attributes(raw: str) -> dict[str, str]:
    scanner = Scanner(raw)
    scanner.expect("{")
    out: dict[str, str] = {}
    if scanner.accept("}"):
        if not scanner.at_end():
            raise ValueError("unexpected text after frontend attributes")
        return out
    while True:
        key = scanner.string() if scanner.peek() == '"' else scanner.name("a key", sigil=False)
        scanner.expect("=")
        c = scanner.peek()
        if c == '"':
            value = scanner.string()
        elif c == "{":
            value = scanner.balanced()
        else:
            value = scanner.raw_value()  # stops before the dict's closing brace
        out[key] = value
        if scanner.accept(","):
            continue
        scanner.expect("}")
        break
    if not scanner.at_end():
        raise ValueError("unexpected text after frontend attributes")
    return out


def _parse_shaped_literal(raw: str) -> tuple[Shape, Any]:
    """A custom call's `literal=`: `s32[2]{0} {1, 2}`, `f32[] 0.1`, or a tuple of them in
    parentheses; (its shape, its value)."""
    from replicas.hlo.literals import parse_literal

    raw = raw.strip()
    if raw.startswith("("):
        if not raw.endswith(")"):
            raise ValueError("a tuple literal must end with ')'")
        parts = [_parse_shaped_literal(part) for part in _top_level_parts(raw[1:-1])]
        return Shape.tuple([shape for shape, _ in parts]), tuple(value for _, value in parts)
    shape_text, _, body = raw.partition(" ")
    shape = Shape.parse(shape_text)
    return shape, parse_literal(body.strip(), shape)


def _top_level_parts(text: str) -> list[str]:
    """`text` split at the commas outside any brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def _fmt_shaped_literal(value: tuple[Shape, Any]) -> str:
    from replicas.hlo.literals import format_literal

    shape, literal = value
    if shape.is_tuple:
        return "( " + ", ".join(_fmt_shaped_literal(v) for v in zip(shape.tuple_shapes, literal)) + " )"
    return f"{shape} {format_literal(literal, shape)}"


def _parse_config_string(raw: str) -> str:
    """backend_config / infeed_config: a quoted string, or XLA's unquoted JSON-like {...}."""
    if raw.startswith("{"):
        return raw
    return _parse_string(raw)


# -- value printers --------------------------------------------------------------------------------


def _fmt_bool(v: Any) -> str:
    return "true" if v else "false"


def format_int_list(v: Any) -> str:
    return "{" + ",".join(str(int(x)) for x in v) + "}"


def _fmt_groups(v: Any) -> str:
    return "{" + ",".join(format_int_list(g) for g in v) + "}"


def _fmt_slice(v: Any) -> str:
    parts = [f"[{s}:{e}]" if st == 1 else f"[{s}:{e}:{st}]" for s, e, st in v]
    return "{" + ", ".join(parts) + "}"


def _fmt_padding(v: Any) -> str:
    return "x".join(f"{lo}_{hi}" if interior == 0 else f"{lo}_{hi}_{interior}" for lo, hi, interior in v)


def format_window(window: dict[str, Any]) -> str:
    rank = max((len(v) for v in window.values()), default=0)
    w = make_window(rank, **{k: v for k, v in window.items() if v is not None})
    parts = []
    if w["size"]:
        parts.append("size=" + "x".join(map(str, w["size"])))
    if any(s != 1 for s in w["stride"]):
        parts.append("stride=" + "x".join(map(str, w["stride"])))
    if any(tuple(p) != (0, 0) for p in w["pad"]):
        parts.append("pad=" + "x".join(f"{lo}_{hi}" for lo, hi in w["pad"]))
    for key in ("lhs_dilate", "rhs_dilate"):
        if any(d != 1 for d in w[key]):
            parts.append(f"{key}=" + "x".join(map(str, w[key])))
    if any(w["window_reversal"]):
        parts.append("rhs_reversal=" + "x".join("1" if r else "0" for r in w["window_reversal"]))
    return "{" + " ".join(parts) + "}"


def _fmt_computation(v: Any) -> str:
    return "%" + v


def _fmt_computation_list(v: Any) -> str:
    return "{" + ", ".join("%" + c for c in v) + "}"


def _fmt_frontend_attributes(v: dict[str, str]) -> str:
    items = []
    for key, value in v.items():
        key_text = key if _COMP_NAME.fullmatch(key) and not key.startswith("%") else quote(key)
        items.append(f"{key_text}={quote(value)}")
    return "{" + ",".join(items) + "}"


def _fmt_config(v: Any) -> str:
    return quote(str(v))


# -- the table -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttrSpec:
    text_name: str
    ir_name: str
    parse: Callable[[str], Any]
    format: Callable[[Any], str]


_INT_ATTRS = ("channel_id", "index", "iota_dimension", "index_vector_dim", "feature_group_count",
              "batch_group_count", "exponent_bits", "mantissa_bits", "feature_index", "k", "split_dimension",
              "concat_dimension", "scatter_dimension", "split_count", "delta", "num_carries")
_BOOL_ATTRS = ("use_global_device_ids", "indices_are_sorted", "unique_indices", "is_stable", "is_host_transfer",
               "left_side", "lower", "unit_diagonal", "largest", "is_reverse", "is_associative")
_INT_LIST_ATTRS = ("dimensions", "fft_length", "slice_sizes", "dynamic_slice_sizes", "lhs_batch_dims",
                   "rhs_batch_dims", "lhs_contracting_dims", "rhs_contracting_dims", "offset_dims",
                   "collapsed_slice_dims", "start_index_map", "operand_batching_dims",
                   "start_indices_batching_dims", "update_window_dims", "inserted_window_dims",
                   "scatter_dims_to_operand_dims", "input_batching_dims", "scatter_indices_batching_dims")
# The attributes that name called computations (the IR's calls: ir.Instruction.called_computations).
COMPUTATION_ATTRS = ("to_apply", "condition", "body", "calls", "true_computation", "false_computation",
                     "select", "scatter", "branch_computations", "called_computations")
_COMPUTATION_LISTS = ("branch_computations", "called_computations")  # a list of names, not one
_ENUM_ATTRS: dict[str, tuple[str, Callable[[str], str]]] = {
    "direction": ("comparison_direction", _enum("EQ", "NE", "GE", "GT", "LE", "LT")),
    "type": ("type", _enum("FLOAT", "TOTALORDER", "SIGNED", "UNSIGNED", "PARTIALORDER")),
    "fft_type": ("fft_type", _enum("FFT", "IFFT", "RFFT", "IRFFT")),
    "distribution": ("distribution", _enum("rng_uniform", "rng_normal")),
    "algorithm": ("algorithm", _enum("rng_default", "rng_three_fry", "rng_philox")),
    "transpose_a": ("transpose_a", _enum("NO_TRANSPOSE", "TRANSPOSE", "ADJOINT")),
    "kind": ("kind", _parse_word),
    "dim_labels": ("dim_labels", _parse_word),
}


def _build_specs() -> dict[str, AttrSpec]:
    specs: dict[str, AttrSpec] = {}

    def add(text: str, ir: str, parse: Callable[[str], Any], fmt: Callable[[Any], str]) -> None:
        specs[text] = AttrSpec(text, ir, parse, fmt)

    for name in _INT_ATTRS:
        add(name, name, parse_int, lambda v: str(int(v)))
    for name in _BOOL_ATTRS:
        add(name, name, _parse_bool, _fmt_bool)
    for name in _INT_LIST_ATTRS:
        add(name, name, parse_int_list, format_int_list)
    for name in COMPUTATION_ATTRS:
        if name in _COMPUTATION_LISTS:
            add(name, name, _parse_computation_list, _fmt_computation_list)
        else:
            add(name, name, _parse_computation, _fmt_computation)
    for text, (ir, parse) in _ENUM_ATTRS.items():
        add(text, ir, parse, str)
    add("slice_sizes", "slice_sizes", _parse_slice_sizes,
        lambda v: _fmt_groups(v) if v and isinstance(v[0], (list, tuple)) else format_int_list(v))
    add("epsilon", "epsilon", _parse_float, lambda v: repr(float(v)))
    add("custom_call_target", "custom_call_target", _parse_string, quote)
    add("literal", "custom_call_literal", _parse_shaped_literal, _fmt_shaped_literal)
    add("backend_config", "backend_config", _parse_config_string, _fmt_config)
    add("infeed_config", "infeed_config", _parse_config_string, _fmt_config)
    add("outfeed_config", "outfeed_config", _parse_config_string, _fmt_config)
    add("outfeed_shape", "outfeed_shape", Shape.parse, str)
    add("replica_groups", "replica_groups", parse_replica_groups, format_replica_groups)
    add("source_target_pairs", "source_target_pairs", _parse_pairs, _fmt_groups)
    add("slice", "slice", _parse_slice, _fmt_slice)
    add("padding", "padding", _parse_padding, _fmt_padding)
    add("window", "window", _parse_window, format_window)
    add("frontend_attributes", "frontend_attributes", parse_frontend_attributes, _fmt_frontend_attributes)
    add("sharding", "sharding", str, str)  # raw `{devices=...}`: SPMD markers read it (replicas.jax)
    return specs


SPECS: dict[str, AttrSpec] = _build_specs()
BY_IR_NAME: dict[str, AttrSpec] = {spec.ir_name: spec for spec in SPECS.values()}

# Attributes that never change what a program computes: accepted and dropped.
DROPPED = frozenset({
    "metadata", "statistics", "origin", "original_value", "operand_precision", "precision_config",
    "result_accuracy", "control-predecessors", "api_version", "schedule", "custom_call_schedule",
    "custom_call_has_side_effect", "operand_layout_constraints", "output_to_operand_aliasing",
    "async_execution_thread", "cross_program_prefetch_index", "cross_program_prefetch", "constrain_layout",
    "domain", "is_composite", "async_group_id", "async_wrapped_computation", "parameter_replication",
    "is_cross_program_prefetch",
})

# Attributes whose meaning depends on the opcode: kept only on these, dropped elsewhere.
KEPT_ONLY_ON = {
    "backend_config": frozenset({"custom-call"}),
    "sharding": frozenset({"custom-call"}),
    "algorithm": frozenset({"rng-bit-generator"}),
}


# Attributes that only repeat what another instruction says: dropped on these opcodes.
DROPPED_ON = {
    "calls": frozenset({"async-update", "async-done"}),  # the async-start names the computation
}


def is_dropped(text_name: str, opcode: str) -> bool:
    if text_name in DROPPED or text_name.startswith(("sdy.", "sdy_")):
        return True
    only = KEPT_ONLY_ON.get(text_name)
    if only is not None and opcode not in only:
        return True
    return opcode in DROPPED_ON.get(text_name, ())
