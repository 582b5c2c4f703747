"""Element-wise chains on 16M-element arrays through the interpreter vs the same numpy expression
written by hand, in the same run (issue goal: within 1.3x).

    python bench/elementwise_chain.py [--size 16777216] [--repeat 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import replicas as rp
from replicas.runtime.interpreter import Interpreter

CHAINS = {
    "(a+b)*c-a": ("""
ENTRY main {{
  a = f32[{n}] parameter(0)
  b = f32[{n}] parameter(1)
  c = f32[{n}] parameter(2)
  s = f32[{n}] add(a, b)
  m = f32[{n}] multiply(s, c)
  ROOT r = f32[{n}] subtract(m, a)
}}""", lambda a, b, c: (a + b) * c - a),
    "tanh(a*b)+exp(-c)": ("""
ENTRY main {{
  a = f32[{n}] parameter(0)
  b = f32[{n}] parameter(1)
  c = f32[{n}] parameter(2)
  m = f32[{n}] multiply(a, b)
  t = f32[{n}] tanh(m)
  nc = f32[{n}] negate(c)
  e = f32[{n}] exponential(nc)
  ROOT r = f32[{n}] add(t, e)
}}""", lambda a, b, c: np.tanh(a * b) + np.exp(-c)),
    "max(a,b)*0.5+c": ("""
ENTRY main {{
  a = f32[{n}] parameter(0)
  b = f32[{n}] parameter(1)
  c = f32[{n}] parameter(2)
  m = f32[{n}] maximum(a, b)
  h = f32[] constant(0.5)
  hb = f32[{n}] broadcast(h), dimensions={{}}
  p = f32[{n}] multiply(m, hb)
  ROOT r = f32[{n}] add(p, c)
}}""", lambda a, b, c: np.maximum(a, b) * np.float32(0.5) + c),
}


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=16 * 1024 * 1024)
    p.add_argument("--repeat", type=int, default=5)
    ns = p.parse_args()
    rng = np.random.default_rng(0)
    a, b, c = (rng.normal(size=ns.size).astype(np.float32) for _ in range(3))
    print(f"element-wise chains, {ns.size} f32 elements, best of {ns.repeat}")
    for name, (body, reference) in CHAINS.items():
        interp = Interpreter(rp.parse_hlo("HloModule chain\n" + body.format(n=ns.size)))
        np.testing.assert_allclose(interp.run([a, b, c]), reference(a, b, c), rtol=1e-5, atol=1e-5)
        ours = best(lambda interp=interp: interp.run([a, b, c]), ns.repeat)
        theirs = best(lambda reference=reference: reference(a, b, c), ns.repeat)
        print(f"  {name:22s} replicas {ours * 1e3:8.1f} ms   numpy {theirs * 1e3:8.1f} ms   ratio {ours / theirs:.2f}x")


if __name__ == "__main__":
    main()
