"""What users pass as values (arguments, feeds): JAX arrays and other array-likes become numpy."""

from __future__ import annotations

from typing import Any

import numpy as np

from replicas.errors import ProgramError

MAX_NESTING = 4  # per-replica list > argument list > tuple argument > its elements: deeper is left as is


def as_value(value: Any, depth: int = 0) -> Any:
    """numpy arrays for array-likes (JAX arrays, ...); lists and tuples keep their structure. Lists of
    numbers, and anything nested deeper than MAX_NESTING, are left for the argument checks."""
    if isinstance(value, np.ndarray) or depth > MAX_NESTING:
        return value
    if isinstance(value, (list, tuple)):
        if not value or isinstance(value[0], (int, float, complex, np.generic)):
            return value
        converted = [as_value(v, depth + 1) for v in value]
        return converted if isinstance(value, list) else tuple(converted)
    if hasattr(value, "__array__") and not isinstance(value, np.generic):
        try:
            return np.asarray(value)
        except Exception as e:  # noqa: BLE001 - a user object's __array__ may raise anything
            raise ProgramError(f"cannot convert a {type(value).__name__} to an array: "
                               f"{type(e).__name__}: {e}") from None
    return value
