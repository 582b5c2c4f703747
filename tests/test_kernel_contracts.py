"""Kernels trust the verifier (docs/architecture.md, "One all-reduce": every path to a kernel passes
`hlo.verify` first), checked by reading the source:

- a kernel in `replicas/ops/`, `replicas/collectives/` or `replicas/channels/` raises only at the
  sites listed here, each for something the verifier
  cannot know (a value seen at run time, the host, what a custom call's target says of itself, a
  kernel's own limit); a new check of what the shape rules already guarantee fails this test: move
  it into the shape rule (`hlo/shape_inference/`) or delete it;
- every string compared with an `.opcode` is an opcode of the table (`hlo/opcodes.py`), where a
  typo would otherwise be silently false.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from replicas.hlo.opcodes import OPCODES

ROOT = Path(__file__).resolve().parent.parent / "replicas"

# (file under replicas/, outermost function) -> (raises, why the verifier cannot check it).
KERNEL_PACKAGES = ("ops", "collectives", "channels")
ALLOWED_RAISES: dict[tuple[str, str], tuple[int, str]] = {
    ("collectives/algorithms.py", "_lead"): (1, "an internal invariant: the selector's last unit never declines"),
    ("collectives/exchange.py", "_check"): (1, "a peer's fingerprint, seen at run time (a collective mismatch)"),
    ("collectives/exchange.py", "publish_on_board"): (1, "an internal invariant of the board's acting leader"),
    ("collectives/exchange.py", "send_stream"): (1, "what the stream's sending thread raised (the transport's error), "
                                                     "raised again in the replica's thread"),
    ("collectives/groups.py", "parse_pairs"): (4, "Send/Recv's routing, a frontend attribute the verifier does "
                                                  "not read"),
    ("collectives/ragged.py", "make_ragged_all_to_all"): (5, "offsets and sizes are run-time values"),
    ("collectives/selector.py", "plan"): (1, "an internal invariant: some unit applies to every situation"),
    ("channels/feeds.py", "host_value_checker"): (7, "what the host fed, at run time"),
    ("channels/feeds.py", "reject_nested_tuple"): (1, "a kernel limit: nested tuples through the host"),
    ("channels/send_recv.py", "channel_id"): (1, "a Send/Recv without channel_id (the shape rule takes one; "
                                                 "the kernel pairs Send and Recv by it)"),
    ("channels/send_recv.py", "channel_pairs"): (2, "Send/Recv's routing, a frontend attribute the verifier "
                                                    "does not read"),
    ("channels/send_recv.py", "_received_checker"): (2, "what a peer sent, at run time"),
    ("constants.py", "make_constant"): (1, "the verifier checks shapes of IR without data (no literal)"),
    ("convert.py", "make_bitcast_convert"): (1, "the host's byte order"),
    ("custom_call.py", "_check_result"): (3, "what a registered Python target returned, at run time"),
    ("custom_call.py", "make_custom_call"): (5, "custom-call targets and their registration, not in the IR"),
    ("custom_call.py", "register_custom_call"): (3, "the arguments of a Python API call"),
    ("dynamic_reshape.py", "make_dynamic_reshape"): (1, "the sizes are run-time values"),
    ("dynamic_shapes.py", "make_set_dimension_size"): (1, "the size is a run-time value"),
    ("elementwise_binary.py", "_binary_type"): (1, "an element type numpy has no kernel for"),
    ("elementwise_binary.py", "make_binary"): (2, "element types numpy has no kernel for"),
    ("elementwise_binary.py", "make_complex"): (1, "an element type numpy has no kernel for"),
    ("lapack.py", "_char"): (1, "a LAPACK custom call's backend_config (not in the shape rules)"),
    ("lapack.py", "_matrices"): (2, "a LAPACK custom call's operands (custom calls have no shape rule)"),
    ("lapack.py", "_results"): (1, "a LAPACK custom call's result (custom calls have no shape rule)"),
    ("lapack.py", "make_orgqr"): (1, "a LAPACK custom call's operands (custom calls have no shape rule)"),
    ("lapack.py", "make_trsm"): (2, "a LAPACK custom call's operands (custom calls have no shape rule)"),
    ("jaxlib_targets.py", "make_dce_sink"): (1, "a jaxlib custom call's result (custom calls have no shape rule)"),
    ("jaxlib_targets.py", "make_csr_sparse_dense"): (3, "a jaxlib custom call's operands, and its indices at run time"),
    ("lapack_eigen.py", "make_gees"): (1, "a LAPACK custom call's backend_config (not in the shape rules)"),
    ("lapack_householder.py", "make_gehrd"): (1, "a LAPACK custom call's backend_config (not in the shape rules)"),
    ("lapack_householder.py", "make_ormqr"): (1, "a LAPACK custom call's operands (custom calls have no shape rule)"),
    ("lapack_tridiagonal.py", "make_gtsv"): (2, "a LAPACK custom call's operands (custom calls have no shape rule)"),
    ("lapack_tridiagonal.py", "make_tridiagonal_solve_perturbed"): (1, "a jaxlib custom call's operands (custom "
                                                                        "calls have no shape rule)"),
    ("python_scalars.py", "_composed"): (1, "a computation the scalar compiler does not cover"),
    # Per-element Python code: signals that a computation is not written so (its numpy kernels run), and
    # that a call met an f32 signaling NaN, which a Python float cannot hold (the numpy kernels run it).
    ("python_elements.py", "unpack"): (1, "a value too large for per-element code"),
    ("python_elements.py", "finish"): (1, "per-element code that would cost more than the numpy kernels"),
    ("python_elements.py", "instruction"): (2, "an op or a value per-element code does not write"),
    ("python_elements.py", "elements_of"): (1, "a value per-element code does not write"),
    ("python_elements.py", "array_of"): (1, "a value per-element code does not write"),
    ("python_elements.py", "array_kernel"): (2, "an op per-element code does not write"),
    ("python_elements.py", "constant"): (2, "a constant per-element code does not write"),
    ("element_layout.py", "layout"): (1, "a layout op per-element code does not write"),
    ("python_elements.py", "_check_f32"): (1, "an f32 signaling NaN among a call's operands"),
    ("element_ops.py", "signaling"): (1, "an f32 signaling NaN made by a bitcast"),
    ("reduce_window.py", "window_geometry"): (1, "a kernel limit: padding that removes the whole operand"),
    ("registry.py", "lookup"): (1, "an opcode with no kernel (the table and the kernels are tied by a test)"),
    ("topk.py", "make_topk_custom_call"): (3, "the TopK custom call's operands (custom calls have no shape rule)"),
}


def _raise_sites() -> Counter:
    sites: Counter = Counter()
    paths = [path for package in KERNEL_PACKAGES for path in sorted((ROOT / package).glob("*.py"))]
    for path in paths:
        name = path.name if path.parent.name == "ops" else f"{path.parent.name}/{path.name}"

        def visit(node: ast.AST, function: str | None, name: str = name) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    visit(child, function or child.name)
                    continue
                if isinstance(child, ast.Raise) and child.exc is not None:
                    sites[(name, function or "<module>")] += 1
                visit(child, function)

        visit(ast.parse(path.read_text()), None)
    return sites


def test_kernels_raise_only_where_the_verifier_cannot_know():
    found = _raise_sites()
    allowed = {site: count for site, (count, _) in ALLOWED_RAISES.items()}
    extra = {site: n for site, n in found.items() if n > allowed.get(site, 0)}
    assert not extra, (f"raises in kernels beyond the listed sites: {extra}; if the verifier guarantees "
                       f"it, drop the check; if not, move it into the shape rule or list it here with why")
    gone = {site for site in allowed if found.get(site, 0) < allowed[site]}
    assert not gone, f"listed sites that no longer raise so often (shrink the list): {gone}"


def _opcode_strings() -> list[tuple[str, int, str]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            if not any(isinstance(s, ast.Attribute) and s.attr == "opcode" for s in sides):
                continue
            for side in sides:
                items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                for item in items:
                    if isinstance(item, ast.Constant) and isinstance(item.value, str):
                        out.append((str(path.relative_to(ROOT)), node.lineno, item.value))
    return out


def test_every_string_compared_with_an_opcode_is_in_the_table():
    strings = _opcode_strings()
    assert len(strings) > 40  # the scan finds the comparisons (`x.opcode == "..."`, `x.opcode in (...)`)
    unknown = [s for s in strings if s[2] not in OPCODES]
    assert not unknown, f"not opcodes of hlo/opcodes.py: {unknown}"
