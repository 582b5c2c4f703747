"""How fast HLO text parses: generate a ~10 MB module (many instructions in XLA's optimized-dump
style: sigils, layouts, metadata, fusions), parse it, print MB/s. Not a test.

    python bench/parse_speed.py [--mb 10] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

from replicas.hlo.text import parse_hlo, print_module


def generate(target_bytes: int) -> str:
    header = ("HloModule bench, is_scheduled=true, entry_computation_layout={(f32[128,256]{1,0})->f32[128,256]{1,0}}, "
              "replica_count=1, num_partitions=1\n\n")
    reducer = ("%add_f32 (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n"
               "  ROOT %sum = f32[] add(%a, %b)\n}\n\n")
    fused = ("%fused_computation (param_0: f32[128,256], param_1: f32[128,256]) -> f32[128,256] {\n"
             "  %param_0 = f32[128,256]{1,0} parameter(0)\n  %param_1 = f32[128,256]{1,0} parameter(1)\n"
             "  ROOT %multiply = f32[128,256]{1,0} multiply(%param_0, %param_1)\n}\n\n")
    lines = ["ENTRY %main (p: f32[128,256]) -> f32[128,256] {", "  %p = f32[128,256]{1,0} parameter(0)",
             "  %zero = f32[] constant(0)"]
    size = len(header) + len(reducer) + len(fused)
    prev = "p"
    k = 0
    while size < target_bytes:
        meta = f', metadata={{op_name="jit(train_step)/layer_{k}/mul" source_file="/src/model.py" source_line={k}}}'
        block = [
            f"  %neg.{k} = f32[128,256]{{1,0}} negate(%{prev}){meta}",
            f"  %fusion.{k} = f32[128,256]{{1,0}} fusion(%neg.{k}, %{prev}), kind=kLoop, calls=%fused_computation",
            f"  %red.{k} = f32[128]{{0}} reduce(%fusion.{k}, %zero), dimensions={{1}}, to_apply=%add_f32{meta}",
            f"  %bc.{k} = f32[128,256]{{1,0}} broadcast(%red.{k}), dimensions={{0}}",
            f"  %cmp.{k} = pred[128,256]{{1,0}} compare(%bc.{k}, %fusion.{k}), direction=GT",
            f"  %sel.{k} = f32[128,256]{{1,0}} select(%cmp.{k}, %bc.{k}, %fusion.{k}){meta}",
        ]
        size += sum(len(line) + 1 for line in block)
        lines.extend(block)
        prev = f"sel.{k}"
        k += 1
    lines.append(f"  ROOT %out = f32[128,256]{{1,0}} copy(%{prev})")
    lines.append("}")
    return header + reducer + fused + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=10.0, help="size of the generated text in MB")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    text = generate(int(args.mb * 1e6))
    mb = len(text.encode()) / 1e6
    best = float("inf")
    module = None
    for _ in range(args.repeat):
        start = time.perf_counter()
        module = parse_hlo(text)
        best = min(best, time.perf_counter() - start)
    n_inst = sum(len(c.instructions) for c in module.computations.values())
    start = time.perf_counter()
    printed = print_module(module)
    print_time = time.perf_counter() - start
    print(f"text: {mb:.1f} MB, {n_inst} instructions")
    print(f"parse: {best:.2f} s  ({mb / best:.1f} MB/s, {n_inst / best / 1e3:.0f}k instructions/s)")
    print(f"print: {print_time:.2f} s  ({len(printed) / 1e6 / print_time:.1f} MB/s of printed text)")


if __name__ == "__main__":
    main()
