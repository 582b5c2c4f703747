"""Memory known before a program runs: the peak bytes one replica holds, from the schedule.

Walking a computation's schedule, the live bytes are its parameters plus every value computed and
not yet released; at each step the step's result, the temporary its kernel declares and, for an
instruction that calls computations (while, call, conditional, fusion, ...), the peak of the
callee above its parameters (which alias the operands) are added. A collective also holds a
transport buffer of its result's size. Views (get-tuple-element, bitcast, a broadcast) are counted
as copies, so the figure is an upper bound.

`check_peak` refuses a program whose peak times the replicas sharing a process is over the byte
ceiling (`replicas.limits`, REPLICAS_MAX_BYTES), naming the instruction where the peak is reached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replicas.caching import Cache
from replicas.errors import ProgramError
from replicas.hlo.ir import Instruction
from replicas.hlo.opcodes import OPCODES
from replicas.limits import current, format_bytes, shape_bytes

# Bytes a kernel may allocate beyond its result, by opcode (a function of the instruction).
_CHUNK = 1 << 23  # iota fills its result a chunk of float64 counts at a time


def _iota_temporary(inst: Instruction) -> int:
    return min(_CHUNK, 8 * max(inst.shape.dimensions, default=1))


def _sort_temporary(inst: Instruction) -> int:
    # The keys made sortable (NaNs and signed zeros ordered as XLA orders them), the permutation in
    # int64, stable-sort buffers and a gathered copy: measured ~33 bytes an element of f32 keys.
    return shape_bytes(inst.shape) + 40 * _leaf_elements(inst)


def _gather_temporary(inst: Instruction) -> int:
    # The start indices widened to int64, clamped, and flat offsets: measured ~24 bytes an element.
    return 32 * _leaf_elements(inst)


def _rng_temporary(inst: Instruction) -> int:
    return min(8 << 20, 8 * _leaf_elements(inst))  # a chunk of float64 draws at a time (ops/rng.py)


def _bit_generator_temporary(inst: Instruction) -> int:
    # ThreeFry/Philox rounds on uint32 and uint64 arrays of the result's size: measured ~3.5x it.
    return 4 * shape_bytes(inst.shape)


TEMPORARIES: dict[str, Any] = {"iota": _iota_temporary, "sort": _sort_temporary, "gather": _gather_temporary,
                               "rng": _rng_temporary, "rng-bit-generator": _bit_generator_temporary}


def _leaf_elements(inst: Instruction) -> int:
    """Elements of `inst`'s result, every leaf of a tuple counted."""
    return sum(max(1, _product(leaf.dimensions)) for leaf in inst.shape.leaves() if leaf.is_array)


@dataclass(frozen=True)
class Peak:
    bytes: int
    instruction: Instruction | None  # where it is reached (None: the parameters alone)
    computation: str


def _elements(inst: Instruction) -> int:
    shape = inst.shape
    return 0 if shape.is_tuple or shape.is_token else max(1, _product(shape.dimensions))


def _product(dims: tuple[int, ...]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def temporary_bytes(inst: Instruction) -> int:
    rule = TEMPORARIES.get(inst.opcode)
    return int(rule(inst)) if rule is not None else 0


def peak_bytes(executable: Any) -> Peak:
    """The peak live bytes of one replica running `executable`'s entry computation."""
    module = executable.module
    schedules = executable.schedules
    memo: dict[str, Peak] = {}

    def computation_peak(name: str, stack: tuple[str, ...]) -> Peak:
        if name in memo:
            return memo[name]
        schedule = schedules[name]
        comp = module.computations[name]
        slot_bytes = [0] * schedule.num_slots
        for inst in comp.instructions:
            if inst.opcode == "parameter":
                slot = schedule.parameter_slots[inst.attrs["parameter_number"]] \
                    if inst.attrs["parameter_number"] < len(schedule.parameter_slots) else None
                if slot is not None:
                    slot_bytes[slot] = shape_bytes(inst.shape)
        live = sum(slot_bytes)
        params = live
        best = Peak(live, None, name)
        for step in schedule.steps:
            inst = step.inst
            extra = shape_bytes(inst.shape) + temporary_bytes(inst)
            spec = OPCODES.get(inst.opcode)
            if spec is not None and spec.collective:
                extra += shape_bytes(inst.shape)
            for called in inst.called_computations():
                if called in schedules and called not in stack:
                    inner = computation_peak(called, stack + (called,))
                    extra += max(0, inner.bytes - _parameter_bytes(module.computations[called]))
            if live + extra > best.bytes:
                best = Peak(live + extra, inst, name)
            live -= slot_bytes[step.result_slot]
            slot_bytes[step.result_slot] = shape_bytes(inst.shape)
            live += slot_bytes[step.result_slot]
            for slot in step.release:
                live -= slot_bytes[slot]
                slot_bytes[slot] = 0
        memo[name] = Peak(max(best.bytes, params), best.instruction, name)
        return memo[name]

    return computation_peak(module.entry, (module.entry,))


def _parameter_bytes(comp: Any) -> int:
    return sum(shape_bytes(inst.shape) for inst in comp.instructions if inst.opcode == "parameter")


# Program fingerprint -> its peak: a warm run's check is a multiplication.
_PEAKS: Cache[Peak] = Cache("program peaks", 256)


def check_peak(executable: Any, replicas_per_process: int | None) -> Peak:
    """`peak_bytes(executable)`, or ProgramError if it times `replicas_per_process` (the replicas
    one process hosts: every replica of the threads backend, an actor's replicas under Ray) is over
    the byte ceiling."""
    key = getattr(executable, "fingerprint", b"")
    peak = _PEAKS.get(key) if key else None
    if peak is None:
        peak = peak_bytes(executable)
        if key:
            _PEAKS.put(key, peak)
    n = replicas_per_process or 1
    ceiling = current().max_bytes
    if peak.bytes * n > ceiling:
        where = f"%{peak.instruction.name} ({peak.instruction.opcode})" if peak.instruction else "its parameters"
        message = (f"each replica holds up to {format_bytes(peak.bytes)} at {where} in computation "
                   f"{peak.computation}; {n} replicas in one process need {format_bytes(peak.bytes * n)}, more "
                   f"than the ceiling of {format_bytes(ceiling)} (replicas.limits.configure(max_bytes=...) or "
                   "REPLICAS_MAX_BYTES)")
        if peak.instruction is not None:
            raise peak.instruction.error(message)
        raise ProgramError(message)
    return peak


__all__ = ["Peak", "TEMPORARIES", "peak_bytes", "check_peak", "temporary_bytes"]
