"""Reading one array of an .npz file with its declared size checked before anything is allocated.

numpy allocates the array an .npy header declares before reading its data, so a 100-byte member
declaring `(10**12,)` would ask for 4 TB. Here the header is read first and its size compared with
the bytes the member holds and with the byte ceiling (`replicas.limits`); damaged data (a bad
deflate stream, a truncated member) is a ProgramError too. Object arrays are never loaded.
"""

from __future__ import annotations

import math
import zipfile
from typing import Any

import numpy as np

from replicas.errors import ProgramError
from replicas.limits import current, format_bytes


def read_npz_array(npz: Any, key: str, what: str) -> np.ndarray:
    """`npz[key]` (an open `numpy.lib.npyio.NpzFile`), or ProgramError naming `what`."""
    archive: zipfile.ZipFile = npz.zip
    member = key + ".npy" if key + ".npy" in archive.namelist() else key
    try:
        info = archive.getinfo(member)
        with archive.open(member) as f:
            version = np.lib.format.read_magic(f)
            header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = header(f, max_header_size=10000)
            data_bytes = info.file_size - f.tell()
    except ProgramError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged member: bad zip, deflate, header or version
        raise ProgramError(f"{what}: not a readable array: {type(e).__name__}: {e}") from None
    if dtype.hasobject:
        raise ProgramError(f"{what} holds Python objects (dtype=object), which are never loaded; save numeric arrays")
    size = math.prod(shape) * dtype.itemsize
    if size > current().max_bytes:
        raise ProgramError(f"{what} declares shape {shape} ({format_bytes(size)}), more than the ceiling of "
                           f"{format_bytes(current().max_bytes)}")
    if size > data_bytes:
        raise ProgramError(f"{what} declares shape {shape} ({format_bytes(size)}) but holds only "
                           f"{format_bytes(max(data_bytes, 0))}")
    try:
        return npz[key]
    except Exception as e:  # noqa: BLE001 - damaged data of any kind (zlib, zip, numpy's reader) is the file's fault
        raise ProgramError(f"{what}: not a readable array: {type(e).__name__}: {e}") from None


__all__ = ["read_npz_array"]
