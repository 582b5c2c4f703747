"""The code generator: a bound computation's steps as one straight-line Python function."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from replicas.hlo.ir import Computation, Instruction
from replicas.ops import python_scalars
from replicas.runtime.ownership import callee, ownership
from replicas.transport import where

if TYPE_CHECKING:
    from replicas.runtime.bound import BoundComputation


# A result at least this large may be written into a dead operand's buffer (as numpy reuses the
# temporaries of `(a + b) * c`): below it, a fresh allocation is cheaper than the bookkeeping.
DONATE_MIN_ELEMENTS = 1 << 16

# Long straight-line code notices a cancel, timeout or deadlock abort every this many kernel calls
# (a computation call and each loop iteration notice it at their start anyway).
ABORT_CHECK_EVERY = 64


def straight_line(bound: BoundComputation, comp: Computation,
                  stacked: set[str] | None = None) -> tuple[Callable[..., Any], dict[int, Instruction]]:
    """Compile the bound steps to straight-line Python: one local per value, `del` at its last use
    in the generated code, `_interp.current` set per kernel call, constants as globals of the code.
    This removes the per-step loop, list and slot overhead from every computation call (a While
    body runs it every iteration).
    Tuples and their elements are Python's own tuple display and subscript, which cannot fail.

    A large element-wise result is written into an operand's buffer (`out=`) when that operand is
    a fresh array made by another element-wise ufunc step of this computation, of the same shape
    and type, and this step is its only reader: nothing else can see the buffer change.

    A loop's condition or body with `scalars` (`ops.python_scalars`) computes on those state
    elements as Python expressions; its fast constants are Python literals there.

    `stacked` (a batched computation, `runtime/batched.py`): the names of the values with a leading
    replica axis. A broadcast is then left to numpy only when unstacked, a result reuses a buffer
    only of its own stacking, and nothing is updated in place (no ownership analysis)."""
    params = bound._params
    steps = bound._steps
    arg_names = [f"a{i}" for i in range(len(params))]
    name_of = {slot: arg_names[i] for i, slot in enumerate(params)}
    operand_vars: list[list[str]] = []
    env: dict[str, Any] = {"_interp": bound._interp}
    # An actor's interpreter also publishes each kernel's instruction in shared memory (transport/where.py).
    codes = getattr(bound._interp, "where_codes", None)
    if codes is not None:
        env["_w"] = bound._interp.where
    for k, (fn, operand_slots, result_slot, _, inst) in enumerate(steps):
        operand_vars.append([name_of[s] for s in operand_slots])
        if inst.opcode == "constant":
            env[f"c{k}"] = fn()  # a constant's kernel returns its one frozen value
            name_of[result_slot] = f"c{k}"
        else:
            name_of[result_slot] = f"v{k}"
    root_var = name_of[bound._root]
    _numpy_broadcasting(comp, steps, operand_vars, stacked or set())
    reshaped = _reshaped_broadcasts(comp, steps, operand_vars, stacked or set(), root_var)
    readers: dict[str, int] = {}
    for names in operand_vars:
        for n in names:
            readers[n] = readers.get(n, 0) + 1

    def fresh_ufunc(k: int) -> bool:
        fn, inst = steps[k][0], steps[k][4]
        return (isinstance(fn, np.ufunc) and fn.nout == 1 and inst.shape.is_array
                and inst.shape.numel >= DONATE_MIN_ELEMENTS)

    if stacked is None:
        in_place, callee_donations, bound.updated_in_place = ownership(steps, bound.donated, operand_vars, readers,
                                                                           root_var, arg_names)
    else:
        in_place, callee_donations = set(), {}
    same_stacking = (lambda a, b: (a in stacked) == (b in stacked)) if stacked is not None else None
    plan = python_scalars.plan(bound._interp.module, comp, bound.scalars) if bound.scalars else None
    texts = operand_vars if plan is None else _python_operands(plan, comp, steps, operand_vars)
    last_use: dict[str, int] = {}
    for k, names in enumerate(texts):
        for n in names:
            last_use[n] = k
    lines = [f"def run({', '.join(arg_names)}):"]
    calls = 0
    line_to_inst: dict[int, Instruction] = {}
    defined = set(arg_names)
    for k, (fn, _, _, _, inst) in enumerate(steps):
        names = texts[k]
        var = f"v{k}"
        opcode = inst.opcode
        expression = plan.python.get(inst.name) if plan is not None else None
        line = None
        if opcode == "constant" or (opcode == "broadcast" and var not in last_use and var != root_var):
            pass  # a global of the code; a broadcast whose readers all broadcast its operand themselves
        elif k in reshaped:
            line = f"{var} = {names[0]}.reshape({reshaped[k]})"
        elif opcode == "get-tuple-element":
            line = f"{var} = {names[0]}[{int(inst.attrs['index'])}]"
        elif getattr(fn, "passes_through", False) and k not in in_place:
            line = f"{var} = {names[0]}"  # a copy: values are never written, the kernel returns its operand
        elif getattr(fn, "reshaped_to", None) is not None and k not in in_place:
            line = f"{var} = {names[0]}.reshape({fn.reshaped_to})"  # the kernel's one call, without its frame
        elif opcode == "tuple":
            line = f"{var} = ({''.join(n + ', ' for n in names)})"
        elif expression is not None:
            line = f"{var} = {expression(names)}"
        else:
            if k in in_place:
                fn = fn.in_place
            elif k in callee_donations:
                fn = bound._interp.computation(callee(inst), callee_donations[k])
            # A bound callee (a fusion, a call) runs its generated code directly: its call's checks are
            # the caller's (an abort is noticed by loops and waits, an error named by the innermost
            # generated line, `bound.failed_instruction`).
            run = getattr(fn, "_run", None) if opcode in ("fusion", "call") else None
            env[f"k{k}"] = fn if run is None else run
            env[f"i{k}"] = inst
            out = ""
            if fresh_ufunc(k):
                for n in names:
                    producer = int(n[1:]) if n[0] == "v" else None
                    if (producer is not None and readers[n] == 1 and n != root_var and fresh_ufunc(producer)
                            and steps[producer][4].shape.compatible(inst.shape)
                            and (same_stacking is None or same_stacking(n, var))):
                        out = f", out={n}"
                        break
            line = f"_interp.current = i{k}; {var} = k{k}({', '.join(names)}{out})"
            calls += 1
            if not calls % ABORT_CHECK_EVERY:
                lines.append("    if _interp.mailbox is not None and _interp.mailbox.aborted is not None: "
                             "raise _interp.mailbox.aborted")
            if codes is not None:
                line = f"_w[{where.CODE}] = {codes.get(id(inst), where.NOWHERE)}; {line}"
            line_to_inst[len(lines) + 1] = inst
        if line is not None:
            lines.append("    " + line)
            defined.add(var)
        # Each value is let go after its last reader (or at once when nothing reads it).
        dead = [n for n in dict.fromkeys(names) if last_use.get(n) == k and n in defined and n != root_var]
        if line is not None and var not in last_use and var != root_var:
            dead.append(var)
        if dead:
            lines.append(f"    del {', '.join(dead)}")
    lines.append(f"    return {root_var}")
    exec(compile("\n".join(lines) + "\n", f"<computation {bound.name}>", "exec"), env)  # noqa: S102
    return env["run"], line_to_inst


def _numpy_broadcasting(comp: Computation, steps: list[Any], operand_vars: list[list[str]],
                        stacked: set[str]) -> None:
    """Let element-wise ufunc steps broadcast their operands themselves (in `operand_vars`): a
    broadcast that only prepends dimensions (numpy's own broadcasting rule) is read through its
    operand by each ufunc reader that keeps another operand of the full shape. numpy's broadcasting
    of a view is the same stride-0 read as `np.broadcast_to`'s, so the values are the same bits;
    the broadcast itself runs only if some other step still reads it."""
    prepends: dict[str, str] = {}  # broadcast var -> its operand's var
    for k, (_, _, _, _, inst) in enumerate(steps):
        if inst.opcode == "broadcast" and inst.shape.is_array:
            rank = inst.shape.rank
            source_rank = comp.instruction(inst.operands[0]).shape.rank
            if (list(inst.attrs.get("dimensions") or []) == list(range(rank - source_rank, rank))
                    and f"v{k}" not in stacked):
                prepends[f"v{k}"] = operand_vars[k][0]
    if not prepends:
        return
    for k, (fn, _, _, _, inst) in enumerate(steps):
        names = operand_vars[k]
        if not (isinstance(fn, np.ufunc) and fn.nout == 1 and fn.nin == len(names) and inst.shape.is_array):
            continue
        dims = inst.shape.dimensions
        kept = [j for j, n in enumerate(names) if n not in prepends]
        if not any(comp.instruction(inst.operands[j]).shape.dimensions == dims for j in kept):
            kept.append(next(j for j, n in enumerate(names) if n in prepends))
        operand_vars[k] = [n if j in kept else prepends[n] for j, n in enumerate(names)]


def _python_operands(plan: python_scalars.Plan, comp: Computation, steps: list[Any],
                     operand_vars: list[list[str]]) -> list[list[str]]:
    """Each step's operands as generated code names them: a fast constant read by a Python
    expression, or by the body's next state in an element kept as a Python number, is its literal."""
    root = comp.root if comp.root_instruction.shape.is_tuple else None
    texts = []
    for (_, _, _, _, inst), names in zip(steps, operand_vars):
        if inst.name in plan.python or inst.name == root:
            names = [plan.literals[o] if o in plan.literals and (inst.name != root or j in plan.scalars) else n
                     for j, (o, n) in enumerate(zip(inst.operands, names))]
        texts.append(names)
    return texts


def _reshaped_broadcasts(comp: Computation, steps: list[Any], operand_vars: list[list[str]], stacked: set[str],
                         root_var: str) -> dict[int, tuple[int, ...]]:
    """Broadcasts (keeping the operand's dimension order) all of whose readers are element-wise ufunc
    steps with another operand of the full shape: the operand reshaped with 1s in the new dimensions
    is enough, numpy's broadcasting does the rest (a reshape instead of `np.broadcast_to`, the same
    stride-0 read). Step -> the reshaped dimensions."""
    candidates: dict[str, tuple[int, tuple[int, ...]]] = {}
    for k, (_, _, _, _, inst) in enumerate(steps):
        var = f"v{k}"
        if inst.opcode != "broadcast" or not inst.shape.is_array or var in stacked or var == root_var:
            continue
        dims = list(inst.attrs.get("dimensions") or [])
        if dims != sorted(dims):
            continue
        source = comp.instruction(inst.operands[0]).shape.dimensions
        expanded = [1] * inst.shape.rank
        for i, d in enumerate(dims):
            expanded[d] = source[i]
        candidates[var] = (k, tuple(expanded))
    if not candidates:
        return {}
    readers: dict[str, list[int]] = {}
    for j, names in enumerate(operand_vars):
        for n in names:
            if n in candidates:
                readers.setdefault(n, []).append(j)
    kept = {n for n in candidates if n in readers}
    changed = True
    while changed:
        changed = False
        for n in sorted(kept):
            for j in readers[n]:
                fn, inst = steps[j][0], steps[j][4]
                names = operand_vars[j]
                full = [o for o in names if o not in kept and _dims(o, comp, steps) == inst.shape.dimensions]
                if not (isinstance(fn, np.ufunc) and fn.nout == 1 and fn.nin == len(names) and inst.shape.is_array
                        and full):
                    kept.discard(n)
                    changed = True
                    break
    return {candidates[n][0]: candidates[n][1] for n in kept}


def _dims(var: str, comp: Computation, steps: list[Any]) -> tuple[int, ...] | None:
    """The dimensions of the value a generated name holds (an argument, a step's value or a constant)."""
    if var[0] == "a":
        shape = next(p.shape for p in comp.parameters if p.attrs["parameter_number"] == int(var[1:]))
    else:
        shape = steps[int(var[1:])][4].shape
    return shape.dimensions if shape.is_array else None
