"""The Operation Semantics document's deadlock: both replicas Send then wait in SendDone before
posting their Recv. SendDone waits for the peer's Recv, so each waits for the other forever.
`replicas` reports it in seconds with the wait-for cycle instead of hanging.

    python examples/deadlock.py
"""

from __future__ import annotations

import numpy as np

import replicas as rp

ROUTE = 'frontend_attributes={_xla_send_recv_source_target_pairs="{{0,1},{1,0}}"}'

PROGRAM = f"""\
HloModule exchange_deadlock, replica_count=2

ENTRY main {{
  x = f32[4] parameter(0)
  tok = token[] after-all()
  snd = (f32[4], u32[], token[]) send(x, tok), channel_id=1, {ROUTE}
  sent = token[] send-done(snd), channel_id=1, {ROUTE}
  rcv = (f32[4], u32[], token[]) recv(sent), channel_id=1, {ROUTE}
  got = (f32[4], token[]) recv-done(rcv), channel_id=1, {ROUTE}
  ROOT y = f32[4] get-tuple-element(got), index=0
}}
"""


def program() -> rp.Module:
    return rp.parse_hlo(PROGRAM)


def main() -> None:
    try:
        rp.run(program(), [np.arange(4, dtype=np.float32)], num_replicas=2, timeout=60)
    except rp.DeadlockError as e:
        print(e)
        print()
        print(e.report.to_dot())


if __name__ == "__main__":
    main()
