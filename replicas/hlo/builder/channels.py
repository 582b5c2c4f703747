"""XlaBuilder channels and feeds: send/recv (and their -done ops), infeed, outfeed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.hlo.builder.collectives import SEND_RECV_PAIRS_ATTR, format_source_target_pairs
from replicas.hlo.builder.core import BuilderCore, XlaOp
from replicas.shapes import Shape


class ChannelOps(BuilderCore):
    # -- send / recv -----------------------------------------------------------------------------------
    def _channel_attrs(self, channel_id: int | None, is_host_transfer: bool,
                       source_target_pairs: Sequence[Sequence[int]] | None,
                       frontend_attributes: dict[str, str] | None) -> dict[str, Any]:
        attrs: dict[str, Any] = {"channel_id": self._channel_id(channel_id),
                                 "is_host_transfer": bool(is_host_transfer)}
        frontend = dict(frontend_attributes or {})
        if source_target_pairs is not None:
            frontend[SEND_RECV_PAIRS_ATTR] = format_source_target_pairs(source_target_pairs)
        if frontend:
            attrs["frontend_attributes"] = frontend
        return attrs

    def send_start(self, operand: XlaOp, token: XlaOp, channel_id: int | None = None, *,
                   is_host_transfer: bool = False, source_target_pairs: Sequence[Sequence[int]] | None = None,
                   frontend_attributes: dict[str, str] | None = None) -> XlaOp:
        """The HLO `send`: returns the (data, u32[] context, token) tuple for `send_done`."""
        attrs = self._channel_attrs(channel_id, is_host_transfer, source_target_pairs, frontend_attributes)
        return self._emit("send", [self._op(operand), self._op(token, "token")], attrs)

    def send_done(self, send: XlaOp) -> XlaOp:
        """The HLO `send-done` of a `send_start`: returns a token."""
        send = self._op(send, "send")
        inst = self._computation.instruction(send.name)
        attrs = {k: inst.attrs[k] for k in ("channel_id", "is_host_transfer", "frontend_attributes")
                 if k in inst.attrs}
        return self._emit("send-done", [send], attrs)

    def recv_start(self, token: XlaOp, shape: Shape | str, channel_id: int | None = None, *,
                   is_host_transfer: bool = False, source_target_pairs: Sequence[Sequence[int]] | None = None,
                   frontend_attributes: dict[str, str] | None = None) -> XlaOp:
        """The HLO `recv`: returns the (data, u32[] context, token) tuple for `recv_done`."""
        if isinstance(shape, str):
            shape = Shape.parse(shape)
        attrs = self._channel_attrs(channel_id, is_host_transfer, source_target_pairs, frontend_attributes)
        result = Shape.tuple([shape, Shape.scalar("u32"), Shape.token()])
        return self._emit("recv", [self._op(token, "token")], attrs, shape=result)

    def recv_done(self, recv: XlaOp) -> XlaOp:
        """The HLO `recv-done` of a `recv_start`: returns the (data, token) tuple."""
        recv = self._op(recv, "recv")
        inst = self._computation.instruction(recv.name)
        attrs = {k: inst.attrs[k] for k in ("channel_id", "is_host_transfer", "frontend_attributes")
                 if k in inst.attrs}
        return self._emit("recv-done", [recv], attrs)

    def send_with_token(self, operand: XlaOp, token: XlaOp, channel_id: int | None = None,
                        **kwargs: Any) -> XlaOp:
        """send + send-done; returns the send-done token."""
        return self.send_done(self.send_start(operand, token, channel_id, **kwargs))

    def send(self, operand: XlaOp, channel_id: int | None = None, token: XlaOp | None = None,
             **kwargs: Any) -> XlaOp:
        """XlaBuilder::Send: send + send-done (after a fresh token unless one is given); returns the token."""
        token = self.create_token() if token is None else token
        return self.send_with_token(operand, token, channel_id, **kwargs)

    def recv_with_token(self, token: XlaOp, shape: Shape | str, channel_id: int | None = None,
                        **kwargs: Any) -> XlaOp:
        """recv + recv-done; returns the (data, token) tuple."""
        return self.recv_done(self.recv_start(token, shape, channel_id, **kwargs))

    def recv(self, shape: Shape | str, channel_id: int | None = None, token: XlaOp | None = None,
             **kwargs: Any) -> XlaOp:
        """XlaBuilder::Recv: recv + recv-done (after a fresh token unless one is given); returns the data."""
        token = self.create_token() if token is None else token
        return self.get_tuple_element(self.recv_with_token(token, shape, channel_id, **kwargs), 0)

    # -- infeed / outfeed ------------------------------------------------------------------------------
    def infeed_with_token(self, token: XlaOp, shape: Shape | str, config: str = "") -> XlaOp:
        """Returns the (data, token) tuple."""
        if isinstance(shape, str):
            shape = Shape.parse(shape)
        attrs = {"infeed_config": config} if config else {}
        return self._emit("infeed", [self._op(token, "token")], attrs, shape=Shape.tuple([shape, Shape.token()]))

    def infeed(self, shape: Shape | str, config: str = "") -> XlaOp:
        """XlaBuilder::Infeed: the data (after a fresh token)."""
        return self.get_tuple_element(self.infeed_with_token(self.create_token(), shape, config), 0)

    def outfeed_with_token(self, operand: XlaOp, token: XlaOp, shape_with_layout: Shape | str | None = None,
                           outfeed_config: str = "") -> XlaOp:
        operand = self._op(operand)
        if isinstance(shape_with_layout, str):
            shape_with_layout = Shape.parse(shape_with_layout)
        attrs: dict[str, Any] = {"outfeed_shape": shape_with_layout or operand.shape}
        if outfeed_config:
            attrs["outfeed_config"] = outfeed_config
        return self._emit("outfeed", [operand, self._op(token, "token")], attrs)

    def outfeed(self, operand: XlaOp, shape_with_layout: Shape | str | None = None,
                outfeed_config: str = "") -> XlaOp:
        """XlaBuilder::Outfeed (after a fresh token); returns the outfeed's token."""
        return self.outfeed_with_token(operand, self.create_token(), shape_with_layout, outfeed_config)
