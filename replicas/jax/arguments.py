"""Arguments as JAX accepts them, as the numpy values the per-device program takes.

A leaf may be a numpy array or scalar (0-d stays 0-d), a Python scalar, a JAX array with any
sharding (its global value is fetched; the program's own input sharding then splits it), or a
typed PRNG key (`jax.random.key(0)`: `key<fry>`, `key<rbg>`, `key<unsafe_rbg>`, a custom impl),
which the compiled program takes as its key data (`jax.random.key_data`: uint32, the impl's key
shape appended). A typed key that a program returns comes back as its key data
(`jax.random.wrap_key_data(data, impl=...)` makes it a key again).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replicas.errors import ProgramError


def is_key_dtype(dtype: Any) -> bool:
    """True for JAX's typed PRNG key element types (`key<fry>`, ...)."""
    if isinstance(dtype, np.dtype):  # every other array's: the per-call path stays cheap
        return False
    import jax

    try:
        return bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))
    except TypeError:
        return False


def physical_dtype(dtype: Any) -> np.dtype:
    """The element type the program's parameter or result has: a typed key's key data type."""
    if is_key_dtype(dtype):
        import jax

        return np.dtype(jax.random.key_data(jax.random.key(0, impl=dtype._impl)).dtype)
    try:
        return np.dtype(dtype)
    except TypeError:
        raise ProgramError(f"an argument of element type {dtype} has no numpy form the program can take") from None


def physical_shape(shape: tuple[int, ...], dtype: Any) -> tuple[int, ...]:
    """The program's shape of a value of `shape` and `dtype` (a typed key adds its impl's key shape)."""
    if is_key_dtype(dtype):
        return tuple(shape) + tuple(dtype._impl.key_shape)
    return tuple(shape)


def signature_dtype(dtype: Any) -> Any:
    """The element type as a cache key: numpy's dtype, or the typed key's own."""
    return dtype if is_key_dtype(dtype) else np.dtype(dtype)


def host_value(leaf: Any, dtype: np.dtype | None = None) -> np.ndarray:
    """The numpy value of an argument leaf (JAX arrays fetched whatever their sharding, typed keys
    as their key data), of `dtype` when given."""
    leaf_dtype = getattr(leaf, "dtype", None)
    if leaf_dtype is not None and is_key_dtype(leaf_dtype):
        import jax

        leaf = jax.random.key_data(leaf)
    value = np.asarray(leaf)
    return value if dtype is None or value.dtype == dtype else value.astype(dtype)
