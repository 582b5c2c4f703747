"""Per-element While loops (`ops.python_elements`) compiled to machine code by numba.

`loops` decides when a loop is compiled and drives it; `text` rewrites the loop's Python for numba;
`helpers` (which imports numba, so only when a loop is compiled) has the functions the compiled
code calls. Kept in a package of its own so importing `replicas.ops` does not import numba.
"""
