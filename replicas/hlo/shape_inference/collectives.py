"""Shape rules of the ops that talk to other replicas, the host or the runtime: collectives,
send/recv, infeed/outfeed, tokens, async wrappers, rng, custom-call, replica-id."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import (
    U32,
    Ctx,
    array_shape,
    check_replica_groups,
    check_scalar_computation,
    compatible,
    rule,
    scalar,
    second_of_start,
    tuple_or_single,
)
from replicas.shapes import Shape


def _arrays(c: Ctx) -> list[Shape]:
    c.count(at_least=1)
    return [c.array(i) for i in range(len(c.operands))]


def _collective_dim(c: Ctx, shapes: list[Shape]) -> int:
    dims = c.int_list("dimensions")
    if len(dims) != 1:
        raise c.fail(f"dimensions must hold exactly one dimension, got {dims}")
    d = dims[0]
    for s in shapes:
        if not 0 <= d < s.rank:
            raise c.fail(f"dimension {d} out of range for operand {s}")
    return d


def _check_all_reduce_computation(c: Ctx, shapes: list[Shape]) -> None:
    comp = c.computation("to_apply")
    types = {s.element_type for s in shapes}
    if len(types) == 1:
        t = shapes[0].element_type
        check_scalar_computation(c, comp, [t, t], [t], "reduction computation")
    elif len(comp.parameter_shapes) != 2:
        raise c.fail(f"reduction computation {comp.name} must take 2 parameters")


def _scaled_shapes(c: Ctx, shapes: list[Shape], group: int | None, multiply: bool) -> list[Shape] | None:
    d = _collective_dim(c, shapes)
    if group is None:
        return None
    out = []
    for s in shapes:
        dims = list(s.dimensions)
        if multiply:
            dims[d] *= group
        else:
            if dims[d] % group:
                raise c.fail(f"dimension {d} of operand {s} (size {dims[d]}) is not divisible by the group size "
                             f"{group}")
            dims[d] //= group
        out.append(array_shape(s.element_type, dims))
    return out


def _check_declared_scaled(c: Ctx, shapes: list[Shape], multiply: bool) -> None:
    """Without a known group size, check the declared result differs only in the collective dimension."""
    r = c.result
    if r is None:
        return
    d = _collective_dim(c, shapes)
    leaves = r.tuple_shapes if len(shapes) > 1 and r.is_tuple else (r,)
    if c.opcode.endswith("-start"):
        leaves = r.tuple_shapes[1].tuple_shapes if len(shapes) > 1 else r.tuple_shapes[1:2]
    for s, out in zip(shapes, leaves):
        big, small = (out, s) if multiply else (s, out)
        ok = (out.is_array and out.rank == s.rank and out.element_type is s.element_type
              and all(a == b for i, (a, b) in enumerate(zip(out.dimensions, s.dimensions)) if i != d)
              and (small.dimensions[d] == 0 and big.dimensions[d] == 0
                   or small.dimensions[d] and big.dimensions[d] % small.dimensions[d] == 0))
        if not ok:
            raise c.fail(f"result {out} does not fit operand {s} along dimension {d}")


@rule("all-reduce", "all-reduce-start")
def _all_reduce(c: Ctx) -> Shape:
    shapes = _arrays(c)
    check_replica_groups(c, uniform=False)
    _check_all_reduce_computation(c, shapes)
    return tuple_or_single(shapes)


@rule("all-gather", "all-gather-start")
def _all_gather(c: Ctx) -> Shape | None:
    shapes = _arrays(c)
    group = check_replica_groups(c, uniform=True)
    out = _scaled_shapes(c, shapes, group, multiply=True)
    if out is None:
        _check_declared_scaled(c, shapes, multiply=True)
        return None
    if c.opcode == "all-gather-start":
        return Shape.tuple([tuple_or_single(shapes), tuple_or_single(out)])
    return tuple_or_single(out)


@rule("reduce-scatter")
def _reduce_scatter(c: Ctx) -> Shape | None:
    shapes = _arrays(c)
    group = check_replica_groups(c, uniform=True)
    _check_all_reduce_computation(c, shapes)
    out = _scaled_shapes(c, shapes, group, multiply=False)
    if out is None:
        _check_declared_scaled(c, shapes, multiply=False)
        return None
    return tuple_or_single(out)


@rule("all-to-all")
def _all_to_all(c: Ctx) -> Shape:
    shapes = _arrays(c)
    group = check_replica_groups(c, uniform=True)
    if c.attrs.get("dimensions"):
        if len(shapes) != 1:
            raise c.fail(f"the array form (with dimensions) takes one operand, got {len(shapes)}")
        d = _collective_dim(c, shapes)
        if group is not None and shapes[0].dimensions[d] % group:
            raise c.fail(f"split dimension {d} of operand {shapes[0]} (size {shapes[0].dimensions[d]}) is not "
                         f"divisible by the group size {group}")
        return shapes[0]
    for i, s in enumerate(shapes):
        if not compatible(s, shapes[0]):
            raise c.fail(f"operand {i} {s} differs from operand 0 {shapes[0]} (tuple all-to-all)")
    if group is not None and len(shapes) != group:
        raise c.fail(f"tuple all-to-all needs one operand per group member ({group}), got {len(shapes)}")
    return Shape.tuple(shapes)


def check_source_target_pairs(c: Ctx) -> None:
    pairs = c.attr("source_target_pairs", [])
    sources: set[int] = set()
    targets: set[int] = set()
    n = c.num_replicas
    for pair in pairs:
        if len(pair) != 2:
            raise c.fail(f"source_target_pairs entry {pair!r} is not a pair")
        s, t = int(pair[0]), int(pair[1])
        for r in (s, t):
            if r < 0 or (n is not None and r >= n):
                raise c.fail(f"source_target_pairs entry {{{s},{t}}}: id {r} out of range"
                             + (f" for {n} replicas" if n is not None else ""))
        if s in sources:
            raise c.fail(f"source_target_pairs has duplicate source {s}")
        if t in targets:
            raise c.fail(f"source_target_pairs has duplicate target {t}")
        sources.add(s)
        targets.add(t)


@rule("collective-permute", "collective-permute-start")
def _collective_permute(c: Ctx) -> Shape | None:
    if len(c.operands) == 4 and c.operands[2].is_tuple:
        raise c.fail("with 4 operands (XLA's in-place form, offsets and slice_sizes) is not supported")
    shapes = _arrays(c)
    check_source_target_pairs(c)
    if len(shapes) not in (1, 4):
        raise c.fail(f"with {len(shapes)} operands (XLA's combined form) is not supported: permute each "
                     "operand on its own")
    s = shapes[0] if len(shapes) == 1 else shapes[1]
    if c.opcode == "collective-permute":
        return s
    r = c.result
    if r is not None and r.is_tuple and len(r.tuple_shapes) > 2:
        # Older XLA adds u32[] context scalars after (operand, result).
        if not (compatible(r.tuple_shapes[0], s) and compatible(r.tuple_shapes[1], s)):
            raise c.fail(f"result {r} must start with (operand, result) = ({s}, {s})")
        return None
    return Shape.tuple([s, s])


@rule("collective-broadcast")
def _collective_broadcast(c: Ctx) -> Shape:
    shapes = _arrays(c)
    check_replica_groups(c, uniform=True)
    return tuple_or_single(shapes)


@rule("all-reduce-done", "collective-broadcast-done")
def _done_same(c: Ctx) -> Shape:
    return c.operands[0]


@rule("all-gather-done", "collective-permute-done")
def _done_second(c: Ctx) -> Shape:
    return second_of_start(c)


@rule("replica-id", "partition-id")
def _replica_id(c: Ctx) -> Shape:
    return scalar(U32)


@rule("ragged-all-to-all")
def _ragged_all_to_all(c: Ctx) -> Shape:
    data, output = c.array(0, "input"), c.array(1, "output")
    if data.element_type is not output.element_type or data.rank != output.rank:
        raise c.fail(f"output {output} must have the input's element type and rank ({data})")
    check_replica_groups(c, uniform=True)
    if data.rank == 0:
        raise c.fail(f"input {data} must have a dimension 0 to split into rows")
    tables = [c.array(i, what) for i, what in
              enumerate(("input_offsets", "send_sizes", "output_offsets", "recv_sizes"), start=2)]
    for s, what in zip(tables, ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")):
        if not s.element_type.is_integral or s.rank != 1 or s.dimensions != tables[0].dimensions:
            raise c.fail(f"{what} {s} must be a 1-D integer array of as many entries as input_offsets "
                         f"({tables[0]})")
    return output
