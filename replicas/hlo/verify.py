"""The module verifier: re-checks a whole module, whoever produced it (builder, HLO text, msgpack).

Checks: the entry exists; in every computation names are unique, operands are defined before use,
parameter numbers are 0..n-1 and unique, the root exists; called computations exist and nothing
recurses; every instruction's shape agrees with shape inference (layouts ignored); replica groups
cover every replica exactly once when the replica count is known; send/recv contexts are used by
the right -done op, once. Errors name the instruction (and its HLO text line when known).
"""

from __future__ import annotations

from replicas.errors import ProgramError
from replicas.hlo.ir import COMPUTATION_ATTRS, Computation, Instruction, Module
from replicas.hlo.opcodes import DONE_OF, GROUPED_OPCODES, OPCODES, PAIRED_OPCODES
from replicas.hlo.shape_inference import infer_shape
from replicas.limits import MAX_NESTING

# A context may also arrive through a loop-carried tuple (XLA's pipelined send/recv).
_PASS_THROUGH = frozenset({"get-tuple-element", "parameter", "opt-barrier"})
_COMMUNICATING = GROUPED_OPCODES | PAIRED_OPCODES


def verify(module: Module, num_replicas: int | None = None) -> None:
    """Raise ProgramError at the first rule the module breaks."""
    if not module.entry:
        raise ProgramError(f"module {module.name} has no entry computation")
    if module.entry not in module.computations:
        raise ProgramError(f"module {module.name}: entry computation {module.entry!r} does not exist")
    declared = _int_attr(module, "replica_count")
    replicas = num_replicas if num_replicas is not None else declared
    partitions = _int_attr(module, "num_partitions") or 1
    # SPMD (partitions run as the job's replicas, one replica each): a collective without a channel id
    # is cross-replica, every partition alone in its group of the one replica, as in XLA.
    spmd = num_replicas is not None and partitions > 1 and (declared or 1) == 1
    for comp in module.computations.values():
        _verify_structure(module, comp)
    _check_no_recursion(module)
    for comp in module.computations.values():
        _verify_shapes(module, comp, replicas, partitions, num_replicas is not None, spmd)
        _verify_async_pairs(comp)


def _int_attr(module: Module, key: str) -> int | None:
    value = module.attrs.get(key)
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ProgramError(f"module {module.name}: attribute {key}={value!r} is not an integer") from None


def _verify_structure(module: Module, comp: Computation) -> None:
    defined: set[str] = set()
    numbers: dict[int, Instruction] = {}
    for inst in comp.instructions:
        if inst.name in defined:
            raise inst.error(f"instruction name %{inst.name} is defined twice in computation {comp.name}")
        for op in inst.operands:
            if op not in defined:
                where = "later" if op in comp.by_name else "nowhere"
                raise inst.error(f"operand %{op} is used before it is defined (defined {where} in "
                                 f"computation {comp.name})")
        for key in COMPUTATION_ATTRS:
            value = inst.attrs.get(key)
            if value is not None and not (isinstance(value, str) or (
                    isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value))):
                raise inst.error(f"attribute {key} must name computations, got {value!r}")
        for called in inst.called_computations():
            if called not in module.computations:
                raise inst.error(f"calls computation {called!r}, which does not exist")
        if inst.opcode == "parameter":
            n = inst.attrs.get("parameter_number")
            if not isinstance(n, int) or n < 0:
                raise inst.error(f"parameter_number must be a non-negative integer, got {n!r}")
            if n in numbers:
                raise inst.error(f"parameter number {n} is already used by %{numbers[n].name}")
            numbers[n] = inst
        defined.add(inst.name)
    missing = sorted(set(range(len(numbers))) - set(numbers))
    if missing:
        raise ProgramError(f"computation {comp.name}: parameter numbers must be 0..{len(numbers) - 1}, "
                           f"missing {missing}")
    if not comp.root:
        raise ProgramError(f"computation {comp.name} has no root instruction")
    if comp.root not in defined:
        raise ProgramError(f"computation {comp.name}: root %{comp.root} is not an instruction of it")


def _check_no_recursion(module: Module) -> None:
    """No computation calls itself, and calls nest at most MAX_NESTING deep (the interpreter runs a
    call as a Python call); iterative, so a hostile chain of thousands is an error, not a crash."""
    callees = {name: sorted({c for inst in comp.instructions for c in inst.called_computations()})
               for name, comp in module.computations.items()}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    height: dict[str, int] = {}  # the longest chain of calls starting at a computation
    for start in module.computations:
        if start in state:
            continue
        path = [start]
        pending = [iter(callees.get(start, ()))]
        state[start] = 1
        while pending:
            callee = next(pending[-1], None)
            if callee is None:
                done = path.pop()
                state[done] = 2
                pending.pop()
                height[done] = 1 + max((height[c] for c in callees.get(done, ())), default=0)
                if height[done] > MAX_NESTING:
                    raise ProgramError(f"computation calls nest deeper than {MAX_NESTING} levels "
                                       f"(from computation {done})")
                continue
            if state.get(callee) == 1:
                cycle = " -> ".join(path[path.index(callee):] + [callee])
                raise ProgramError(f"computation {callee} calls itself (recursion is not allowed): {cycle}")
            if callee in state:
                continue
            state[callee] = 1
            path.append(callee)
            pending.append(iter(callees.get(callee, ())))


def _participants(inst: Instruction, replicas: int | None, partitions: int, explicit: bool,
                  spmd: bool = False) -> int | None:
    """How many device ids the instruction's replica groups (or pairs) range over.

    An explicit `num_replicas` is the number of devices the runtime runs, so every id lies below it,
    except in an SPMD job (`spmd`), where groups without a channel id name the one replica (0).
    Otherwise follow XLA's group modes: flattened ids (use_global_device_ids) span replicas x
    partitions; a channel_id on all-to-all / collective-permute / collective-broadcast means
    cross-partition ids; everything else counts replicas.
    """
    if spmd and inst.attrs.get("channel_id") is None and inst.opcode in GROUPED_OPCODES:
        return 1
    if replicas is None or explicit:
        return replicas
    if inst.attrs.get("use_global_device_ids"):
        return replicas * partitions
    if inst.attrs.get("channel_id") is not None and partitions > 1 and OPCODES[inst.opcode].channel_groups_partitions:
        return partitions
    return replicas


def _verify_shapes(module: Module, comp: Computation, replicas: int | None, partitions: int,
                   explicit: bool, spmd: bool = False) -> None:
    by_name = comp.by_name
    for inst in comp.instructions:
        spec = OPCODES.get(inst.opcode)
        if spec is not None and not spec.supported:
            raise inst.error(f"{inst.opcode} is not supported: it parses, but no kernel runs it")
        operand_shapes = [by_name[op].shape for op in inst.operands]
        n = _participants(inst, replicas, partitions, explicit, spmd) if inst.opcode in _COMMUNICATING else None
        try:
            inferred = infer_shape(inst.opcode, operand_shapes, inst.attrs, module.computation,
                                   result=inst.shape, num_replicas=n)
        except ProgramError as e:
            raise inst.error(str(e)) from None
        if inferred is not None and not inferred.compatible(inst.shape):
            raise inst.error(f"shape {inst.shape.without_layout()} does not match the inferred shape {inferred}")


def _verify_async_pairs(comp: Computation) -> None:
    by_name = comp.by_name
    consumer: dict[str, Instruction] = {}
    for inst in comp.instructions:
        starts = DONE_OF.get(inst.opcode)
        if starts is None:
            continue
        if len(inst.operands) != 1:
            raise inst.error(f"{inst.opcode} takes exactly one operand (the matching start)")
        operand = by_name[inst.operands[0]]
        if operand.opcode not in starts and operand.opcode not in _PASS_THROUGH:
            raise inst.error(f"operand %{operand.name} is a {operand.opcode}, but {inst.opcode} needs the "
                             f"context of a {' or '.join(starts)}")
        if inst.opcode in ("send-done", "recv-done") and operand.opcode in starts:
            a, b = inst.attrs.get("channel_id"), operand.attrs.get("channel_id")
            if a is not None and b is not None and a != b:
                raise inst.error(f"channel_id {a} differs from the channel_id {b} of %{operand.name}")
        if inst.opcode == "async-update":
            continue
        previous = consumer.get(operand.name)
        if previous is not None and operand.opcode in starts:
            raise inst.error(f"the context %{operand.name} is already consumed by %{previous.name}; "
                             f"each {operand.opcode} has exactly one {inst.opcode}")
        consumer[operand.name] = inst
