"""Values that should agree, checked: an output meant to be replicated (out_specs=P(), a
replicated output sharding, or outputs `rp.check` is told are) must be the same on every
replica. JAX returns one replica's copy and cannot see a forgotten pmean, per-replica randomness
or batch-norm statistics left unsynchronized; here a difference is a `ReplicaDivergenceError`.

A normal run pays only the comparison of those outputs (bitwise, or within `tolerance`). When
they differ, the program runs again on threads with every instruction's value recorded (a
digest of it, or the value itself under a tolerance: `FlightRecorder(every_instruction="values")`),
and the search walks back from the output through values that differ across replicas to the
first one whose operands all agreed: where the divergence was born (a replica-id, an rng, an
argument that differs across replicas and reaches the output without a collective).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from replicas.errors import ReplicaDivergenceError
from replicas.hlo.ir import Module
from replicas.hlo.source import SourceMap
from replicas.records import replicas_text

HUNT_EVENTS = 1 << 18  # instruction values kept per replica while hunting (the last ones)
_UNKNOWN = object()


def agree(a: Any, b: Any, tolerance: float) -> bool:
    """Bitwise equality (tolerance 0; NaNs equal themselves), or within `tolerance` (absolute and relative)."""
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return (isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b)
                and all(agree(x, y, tolerance) for x, y in zip(a, b)))
    if isinstance(a, (str, bytes)) or isinstance(b, (str, bytes)):
        return a == b
    if a is b:  # a collective's result is often one buffer shared by the replicas of a process
        return True
    x, y = np.asarray(a), np.asarray(b)
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if tolerance and (np.issubdtype(x.dtype, np.inexact)):
        return bool(np.allclose(x, y, rtol=tolerance, atol=tolerance, equal_nan=True))
    # Bitwise, without copies: the bytes of both, as unsigned bytes.
    return bool(np.array_equal(np.ascontiguousarray(x).reshape(-1).view(np.uint8),
                               np.ascontiguousarray(y).reshape(-1).view(np.uint8)))


def sides_of(values: Sequence[Any], tolerance: float = 0.0) -> list[list[int]]:
    """Replicas grouped by the value they hold (each group agrees with its first member)."""
    groups: list[list[int]] = []
    for r, v in enumerate(values):
        for g in groups:
            if agree(values[g[0]], v, tolerance):
                g.append(r)
                break
        else:
            groups.append([r])
    return groups


def first_divergent_output(results: Sequence[Sequence[Any]], outputs: Sequence[int], tolerance: float = 0.0
                           ) -> tuple[int, list[list[int]]] | None:
    """(output index, sides) of the first of `outputs` that differs across replicas; None if all agree."""
    for i in outputs:
        sides = sides_of([r[i] for r in results], tolerance)
        if len(sides) > 1:
            return i, sides
    return None


def check_outputs(module: Module, args: Sequence[Sequence[Any]], results: Sequence[Sequence[Any]],
                  outputs: Sequence[int], names: Sequence[str] | None = None, tolerance: float = 0.0,
                  replicas: Sequence[int] | None = None) -> None:
    """Raise ReplicaDivergenceError when an output of `outputs` (indices into each replica's flat
    results) differs across replicas. `args`: each replica's arguments, for the hunt's re-run;
    `replicas`: which replicas' results `results` holds (default: all, in order)."""
    found = first_divergent_output(results, outputs, tolerance)
    if found is None:
        return
    index, sides = found
    ids = list(replicas) if replicas is not None else list(range(len(results)))
    sides = [[ids[k] for k in side] for side in sides]
    name = names[index] if names is not None and index < len(names) else f"output {index}"
    raise divergence_error(module, args, index, name, sides, tolerance,
                           [r[index] for r in results])


def divergence_error(module: Module, args: Sequence[Sequence[Any]], index: int, name: str,
                     sides: list[list[int]], tolerance: float, values: Sequence[Any]) -> ReplicaDivergenceError:
    if all(len(s) == 1 for s in sides):
        side_text = f"each of {replicas_text([s[0] for s in sides])} holds a value of its own"
    else:
        side_text = "; ".join(f"{replicas_text(s)} {'holds' if len(s) == 1 else 'hold'} "
                              f"{'one value' if k == 0 else 'another'}" for k, s in enumerate(sides))
    detail = _difference(values[sides[0][0]], values[sides[1][0]])
    what = "bitwise" if not tolerance else f"within {tolerance}"
    message = f"{name} is meant to be replicated but differs across replicas ({what}): {side_text}{detail}"
    report: dict[str, Any] = {"output": name, "index": index, "sides": sides, "tolerance": tolerance}
    try:
        origin = hunt(module, args, index, tolerance)
    except Exception as e:  # noqa: BLE001 - the divergence stands; the hunt is a bonus
        origin = {"note": f"the re-run that looks for its origin failed: {type(e).__name__}: {e}"}
    report.update(origin)
    instruction = origin.get("instruction")
    source = origin.get("source")
    if instruction is not None:
        where = f"%{instruction} ({origin['opcode']})" + (f" from {source}" if source else "")
        if origin.get("argument") is not None:
            message += (f"; it comes from argument {origin['argument']} (%{instruction}), which differs across "
                        "replicas and reaches the output without a collective that makes it agree")
            if origin.get("first_use"):
                use = origin["first_use"]
                message += (f": the first value computed from it that differs is %{use['instruction']} "
                            f"({use['opcode']})" + (f" from {use['source']}" if use.get("source") else ""))
        else:
            message += (f"; the first instruction whose value diverges although everything it depends on "
                        f"agreed is {where}")
    elif origin.get("note"):
        message += f"; {origin['note']}"
    return ReplicaDivergenceError(message, output=name, sides=sides, instruction=instruction, source=source,
                                  report=report)


def _difference(a: Any, b: Any) -> str:
    try:
        x, y = np.asarray(a), np.asarray(b)
        if x.shape == y.shape and np.issubdtype(x.dtype, np.number) and x.size:
            diff = np.abs(x.astype(np.float64) - y.astype(np.float64))
            return f" (largest difference {float(np.nanmax(diff)):.6g})"
    except (TypeError, ValueError):
        pass
    return ""


# -- the hunt ---------------------------------------------------------------------------------


def hunt(module: Module, args: Sequence[Sequence[Any]], index: int, tolerance: float) -> dict[str, Any]:
    """Run `module` again on threads recording every instruction's value; where output `index`'s
    divergence was born (see the module docstring), as a dict: instruction, opcode, computation,
    source, and `argument` when it is an entry parameter."""
    from replicas.runtime.driver import launch

    n = len(args)
    job = launch(module, [list(a) for a in args], n, backend="threads", timeout=600,
                 record_every_instruction="values~" if tolerance else "values", trace_events=HUNT_EVENTS)
    with job:
        job.result()
        events = job.events()
    if any(evs and evs[0].get("kind") == "truncated" for evs in events.values()):
        return {"note": f"the program ran more than {HUNT_EVENTS} instructions per replica: the origin of the "
                        "divergence is not known"}
    return _Search(module, args, events, tolerance).origin(index)


class _Search:
    def __init__(self, module: Module, args: Sequence[Sequence[Any]], events: dict[int, list[dict[str, Any]]],
                 tolerance: float) -> None:
        self.module = module
        self.args = args
        self.tolerance = tolerance
        self.sources = SourceMap(module)
        self.replicas = sorted(events)
        # (computation, instruction) -> {replica: value of its last execution}
        self.last: dict[tuple[str, str], dict[int, Any]] = {}
        for r, evs in events.items():
            for ev in evs:
                if ev.get("kind") == "op" and "value" in ev:
                    self.last.setdefault((ev.get("computation"), ev["instruction"]), {})[r] = ev["value"]

    def differs(self, comp: str, name: str) -> bool | None:
        """Whether instruction `name` of `comp` held different values across replicas (None: unknown)."""
        entry = self.module.entry_computation
        inst = self.module.computation(comp).by_name.get(name)
        if inst is not None and inst.opcode == "parameter":
            if comp != entry.name:
                return False  # reached only when its caller's operands agreed
            k = inst.attrs["parameter_number"]
            return len(sides_of([a[k] for a in self.args], self.tolerance)) > 1
        values = self.last.get((comp, name))
        if values is None or len(values) < len(self.replicas):
            return None
        return len(sides_of([values[r] for r in self.replicas], self.tolerance)) > 1

    def origin(self, index: int) -> dict[str, Any]:
        entry = self.module.entry_computation
        root = entry.root_instruction
        start = root.operands[index] if root.opcode == "tuple" and index < len(root.operands) else root.name
        found = self._walk(entry.name, start, set())
        if found is None:
            return {"note": "no instruction's value was seen to diverge (the output's value differs only at the end)"}
        comp, name, path = found
        inst = self.module.computation(comp).instruction(name)
        out = self._describe(comp, name)
        if inst.opcode == "parameter" and comp == entry.name:
            out["argument"] = inst.attrs["parameter_number"]
            use = next((p for p in reversed(path) if self.sources.text(p[1], p[0])), path[-1] if path else None)
            if use is not None:
                out["first_use"] = self._describe(*use)
        return out

    def _describe(self, comp: str, name: str) -> dict[str, Any]:
        inst = self.module.computation(comp).instruction(name)
        return {"instruction": name, "opcode": inst.opcode, "computation": comp,
                "source": self.sources.text(name, comp), "line": inst.line}

    def _walk(self, comp: str, name: str, seen: set) -> tuple[str, str, list[tuple[str, str]]] | None:
        """Back from a diverged value through diverged operands; (computation, instruction, the path
        walked from the output to just before it)."""
        path: list[tuple[str, str]] = []
        while (comp, name) not in seen:
            seen.add((comp, name))
            inst = self.module.computation(comp).instruction(name)
            if self.differs(comp, name) is False:
                return None
            if inst.opcode == "parameter":
                return comp, name, path
            diverged = [o for o in dict.fromkeys(inst.operands) if self.differs(comp, o)]
            if diverged:
                path.append((comp, name))
                name = diverged[0]
                continue
            for called in inst.called_computations():
                inner = self.module.computation(called)
                if self.differs(called, inner.root):
                    found = self._walk(called, inner.root, seen)
                    if found is not None and self.module.computation(found[0]).instruction(found[1]).opcode \
                            != "parameter":
                        return found[0], found[1], path + found[2]
            return comp, name, path
        return None


def checked_tolerance(tolerance: Any) -> float | None:
    """`replicated_tolerance=`: 0 compares bitwise, a positive number within it, None turns the check off."""
    if tolerance is None:
        return None
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not tolerance >= 0:
        from replicas.errors import ProgramError

        raise ProgramError(f"replicated_tolerance must be a number >= 0 or None, got {tolerance!r}")
    return float(tolerance)


def check_jax_outputs(program: Any, args: Sequence[Sequence[Any]], results: Sequence[Any],
                      tolerance: float | None) -> None:
    """The outputs of a `JaxProgram` that JAX declares replicated (a replicated output sharding, as
    `out_specs=P()` gives) must agree across the replicas (`check_outputs`). `results`: each
    replica's result, or its list of outputs with None for one kept on the replicas (a resident
    job's large outputs under Ray): those are not fetched for the check, which costs the call
    nothing more than comparing what came back."""
    if tolerance is None or program.num_replicas < 2:
        return
    count = len(program.out_avals)
    flat = [list(r) if isinstance(r, list) else list(r) if count != 1 or (isinstance(r, tuple) and len(r) == 1)
            else [r] for r in results]
    outputs = [i for i, s in enumerate(program.out_shardings)
               if (s is None or getattr(s, "is_fully_replicated", False)) and all(f[i] is not None for f in flat)]
    if outputs:
        check_outputs(program.module, args, flat, outputs, _output_names(program), tolerance)


def _output_names(program: Any) -> list[str]:
    """`output ['loss']`, `output [1]`: each flattened output by its path in the function's result."""
    try:
        import jax

        paths = jax.tree_util.tree_flatten_with_path(
            jax.tree_util.tree_unflatten(program.out_tree, list(range(len(program.out_avals)))))[0]
        return [f"output {jax.tree_util.keystr(p) or '(the result)'}" for p, _ in paths]
    except Exception:  # noqa: BLE001 - names are a courtesy
        return [f"output {i}" for i in range(len(program.out_avals))]
