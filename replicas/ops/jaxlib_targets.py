"""The CPU custom-call targets jaxlib registers that are not LAPACK: `dce_sink` and
`cpu_csr_sparse_dense_ffi` run here; jaxlib's host callbacks are refused, each for the reason `REFUSED` gives.

The LAPACK targets (`lapack_<t><routine>_ffi`) are in `ops/lapack*.py`. Which targets jaxlib
registers: `jaxlib_cpu_targets()` (JAX's own list; the tests check every one has a kernel or a
refusal here).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.custom_call import builtin_target
from replicas.ops.registry import KernelContext

# target -> why replicas does not run it as a custom call (the error names the reason).
REFUSED: dict[str, str] = {
    "xla_ffi_python_cpu_callback": "a host callback (jax.debug.print, jax.debug.callback, pure_callback, "
                                   "io_callback) names a Python function of the process that lowered it: "
                                   "run the function through rp.jax, which carries the callback",
    "xla_ffi_partitioned_python_cpu_callback": "a host callback of a partitioned program (see "
                                               "xla_ffi_python_cpu_callback): run the function through rp.jax",
    "xla_buffer_python_cpu_callback": "JAX's legacy host callback (see xla_ffi_python_cpu_callback): run the "
                                      "function through rp.jax",
}


def jaxlib_cpu_targets() -> set[str]:
    """Every custom-call target the installed jaxlib registers for CPU (imports JAX)."""
    import jax
    from jax._src.lib import _jax
    from jaxlib.cpu import _lapack, _sparse

    jax.devices("cpu")  # the CPU client registers jaxlib's targets when it starts
    return set(_jax.custom_call_targets("Host")) | set(_lapack.registrations()) | set(_sparse.registrations())


@builtin_target("dce_sink")
def make_dce_sink(inst: Instruction, ctx: KernelContext) -> Callable[..., tuple[()]]:
    """`lax.dce_sink(x, prevent_mlir_dce=True)`: keeps `x` alive, computes nothing."""
    if not inst.shape.is_tuple or inst.shape.tuple_shapes:
        raise inst.error(f"dce_sink returns the empty tuple, the instruction declares {inst.shape}")

    def dce_sink(*_: np.ndarray) -> tuple[()]:
        return ()

    return dce_sink


@builtin_target("cpu_csr_sparse_dense_ffi")
def make_csr_sparse_dense(inst: Instruction, ctx: KernelContext) -> Callable[..., np.ndarray]:
    """A CSR matrix (data, row pointers, column indices) times a dense vector or matrix
    (`jax.experimental.sparse` on CPU): out[r] = sum of data[j] * rhs[indices[j]] over the row's j."""
    shapes = ctx.operand_shapes(inst)
    if len(shapes) != 4 or not all(s.is_array for s in shapes) or inst.shape.is_tuple:
        raise inst.error(f"cpu_csr_sparse_dense_ffi takes (data, indptr, indices, rhs) arrays, got "
                         f"{', '.join(map(str, shapes))} -> {inst.shape}")
    data_shape, indptr_shape, indices_shape, rhs_shape = shapes
    rows = indptr_shape.dimensions[-1] - 1 if indptr_shape.rank == 1 else -1
    if (data_shape.rank != 1 or indices_shape.dimensions != data_shape.dimensions or rows < 0
            or rhs_shape.rank not in (1, 2) or inst.shape.dimensions != (rows,) + rhs_shape.dimensions[1:]):
        raise inst.error(f"cpu_csr_sparse_dense_ffi: data {data_shape}, indices {indices_shape}, indptr "
                         f"{indptr_shape} and rhs {rhs_shape} do not make {inst.shape}")
    dtype = inst.shape.dtype
    columns = rhs_shape.dimensions[0]

    def csr_sparse_dense(data: np.ndarray, indptr: np.ndarray, indices: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        counts = np.diff(indptr)
        if (counts < 0).any() or indptr[0] != 0 or indptr[-1] > data.shape[0] or (
                (indices < 0) | (indices >= columns)).any():
            raise inst.error("cpu_csr_sparse_dense_ffi: row pointers or column indices out of range")
        row = np.repeat(np.arange(rows), counts)
        used = int(indptr[-1])
        out = np.zeros((rows,) + rhs.shape[1:], dtype)
        products = (data[:used].reshape((used,) + (1,) * (rhs.ndim - 1)) * rhs[indices[:used]]).astype(dtype)
        np.add.at(out, row, products)
        return out

    return csr_sparse_dense
