"""Per-element While loops (`ops.python_elements`) compiled to machine code.

`loops` decides when a loop is compiled and drives it; `text` rewrites the loop's trip as a small
function; `emit` (which imports llvmlite, so only when a loop is compiled) compiles it to LLVM IR.
Kept in a package of its own so importing `replicas.ops` imports neither.
"""
