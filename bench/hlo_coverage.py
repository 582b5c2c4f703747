"""How many modules of a set of .hlo files parse, and how many run (XLA's parser is the goal: every
module it accepts). Files hold one module, or several separated by `// -----` (XLA's lit style).

    python bench/hlo_coverage.py tests/xla_hlo_sample/*.hlo [more.hlo ...]

Each module runs once on the threads backend with small random integer arguments (its declared
replica count, else 1; elided constants as elided="random"). Prints each failure and the totals.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

import replicas as rp
from replicas.shapes import Shape


def argument(shape: Shape, rng: np.random.Generator):
    if shape.is_tuple:
        return tuple(argument(s, rng) for s in shape.tuple_shapes)
    if shape.is_token:
        return rp.TOKEN
    return np.asarray(rng.integers(0, 4, size=shape.dimensions)).astype(shape.dtype)


def main(paths: list[str]) -> None:
    parsed = ran = total = 0
    for path in paths:
        for k, text in enumerate(pathlib.Path(path).read_text().split("// -----")):
            if not text.strip():
                continue
            total += 1
            name = f"{pathlib.Path(path).name}:{k}"
            try:
                module = rp.parse_hlo(text, elided="random")
            except rp.ReplicasError as e:
                print("does not parse", name, str(e)[:200].replace("\n", " "))
                continue
            parsed += 1
            try:
                args = [argument(p.shape, np.random.default_rng(k)) for p in module.entry_computation.parameters]
                n = int(module.attrs.get("replica_count") or 1) * module.num_partitions
                rp.run(module, args, num_replicas=n, backend="threads", timeout=30)
                ran += 1
            except rp.ReplicasError as e:
                print("does not run ", name, type(e).__name__, str(e)[:200].replace("\n", " "))
    print(f"modules {total}: parsed {parsed}, ran {ran}")


if __name__ == "__main__":
    main(sys.argv[1:])
