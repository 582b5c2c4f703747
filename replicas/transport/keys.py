"""Every message key, built in one place.

A message is delivered to a replica's mailbox under (source, key); a (source, key) pair is
delivered at most once. The key's first element names the protocol, so a message left over
in a mailbox can be explained (`describe_leftover` in `replicas check`):

- `("coll", seq, round)`: round `round` of the sender's collective number `seq`. Keys do not
  depend on the kind of collective: a replica that reached a different collective still sends
  under the same key, and the receiver reports the mismatch instead of waiting forever.
- `("chan", channel, seq)`: the data of the sender's Send number `seq` to this peer on `channel`;
- `("chan-ack", channel, seq)`: the receiver's Recv number `seq` from this peer is posted;
- `("infeed", seq)`: the host's value for the replica's Infeed number `seq`;
- `("host", channel, seq)`: the host's value for the replica's host-transfer Recv number `seq`.
"""

from __future__ import annotations

COLLECTIVE = "coll"
CHANNEL = "chan"
CHANNEL_ACK = "chan-ack"
INFEED = "infeed"
HOST_TRANSFER = "host"


def collective(seq: int, round_: int) -> tuple[str, int, int]:
    return (COLLECTIVE, seq, round_)


def channel(channel_id: int, seq: int) -> tuple[str, int, int]:
    return (CHANNEL, channel_id, seq)


def channel_ack(channel_id: int, seq: int) -> tuple[str, int, int]:
    return (CHANNEL_ACK, channel_id, seq)


def infeed(seq: int) -> tuple[str, int]:
    return (INFEED, seq)


def host_transfer(channel_id: int, seq: int) -> tuple[str, int, int]:
    return (HOST_TRANSFER, channel_id, seq)
