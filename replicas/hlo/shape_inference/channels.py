"""Shape rules of send/recv (and their -done ops) and infeed/outfeed."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import (
    U32,
    Ctx,
    compatible,
    rule,
    scalar,
)
from replicas.shapes import Shape


def _channel(c: Ctx) -> None:
    cid = c.attrs.get("channel_id")
    if cid is not None and (not isinstance(cid, int) or cid < 0):
        raise c.fail(f"channel_id must be a non-negative integer, got {cid!r}")


def _is_context(s: Shape) -> bool:
    return (s.is_tuple and len(s.tuple_shapes) == 3 and compatible(s.tuple_shapes[1], scalar(U32))
            and s.tuple_shapes[2].is_token)


@rule("send")
def _send(c: Ctx) -> Shape:
    _channel(c)
    c.token(1, "operand 1 (the token)")
    return Shape.tuple([c.operands[0], scalar(U32), Shape.token()])


@rule("recv")
def _recv(c: Ctx) -> None:
    _channel(c)
    c.token(0, "operand 0 (the token)")
    if c.result is not None and not _is_context(c.result):
        raise c.fail(f"result must be (data, u32[], token[]), got {c.result}")
    return None


@rule("send-done")
def _send_done(c: Ctx) -> Shape:
    _channel(c)
    if not _is_context(c.operands[0]):
        raise c.fail(f"operand must be a send's (data, u32[], token[]), got {c.operands[0]}")
    return Shape.token()


@rule("recv-done")
def _recv_done(c: Ctx) -> Shape:
    _channel(c)
    s = c.operands[0]
    if not _is_context(s):
        raise c.fail(f"operand must be a recv's (data, u32[], token[]), got {s}")
    return Shape.tuple([s.tuple_shapes[0], Shape.token()])


@rule("infeed")
def _infeed(c: Ctx) -> None:
    c.token(0, "operand 0 (the token)")
    r = c.result
    if r is not None and not (r.is_tuple and len(r.tuple_shapes) == 2 and r.tuple_shapes[1].is_token):
        raise c.fail(f"result must be (data, token[]), got {r}")
    return None


@rule("outfeed")
def _outfeed(c: Ctx) -> Shape:
    c.token(1, "operand 1 (the token)")
    declared = c.attrs.get("outfeed_shape")
    if declared is not None and not compatible(declared, c.operands[0]):
        raise c.fail(f"outfeed_shape {declared} does not match the data operand {c.operands[0]}")
    return Shape.token()
