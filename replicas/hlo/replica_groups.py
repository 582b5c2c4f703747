"""The three text forms of XLA's `replica_groups`, read into the IR's explicit list of groups.

- explicit lists: `{{0,1},{2,3}}`, and `{}` (one group of every replica);
- iota: `[2,4]<=[4,2]T(1,0)`: iota(N) reshaped to the reshape dims, transposed, cut into groups;
- mesh (JAX's GSPMD programs): `mesh['a'=4,'b'=2] {'a'}`, optionally with the mesh's device order
  `mesh['a'=4,'b'=2], device_ids=([2,2,2]T(0,2,1)) {'a'}`, and sub-axes `{'a':(1)2}` (the size-2
  part of axis `a` whose major factor has size 1). A group is every device that differs only in
  the named axes, ordered by them in the order named; groups are ordered by the other axes.

All three are stored as `list[list[int]]` (`[]` for `{}`), what every pass and kernel reads. The
compact forms are a `ReplicaGroups`, a list that also remembers the text it was read from, and
print back in it: a module's text keeps a 4096-device group in one short line, as XLA wrote it.
Groups changed in place since they were read print as explicit lists.
"""

from __future__ import annotations

import math
import re

import numpy as np

from replicas import limits

# Repetitions are possessive: matching stays linear in the input (hostile text).
_BRACED_GROUPS = re.compile(r"\{\s*(?:\{[^{}]*\}(?:\s*,\s*\{[^{}]*\})*+)?\s*\}")
_GROUP = re.compile(r"\{([^{}]*)\}")
_INT = re.compile(r"-?[0-9]+")
_IOTA = re.compile(r"\[([0-9,\s]*)\]\s*<=\s*\[([0-9,\s]*)\](?:\s*T\(([0-9,\s]*)\))?")
_AXIS_NAME = r"(?:'[^'\s]*'|\"[^\"\s]*\"|[A-Za-z_][A-Za-z0-9_]*)"
_MESH = re.compile(r"mesh\s*\[([^\]]*)\]\s*(?:,\s*device_ids\s*=\s*\(((?:[^(){}]|\([^(){}]*\))*+)\))?\s*\{([^{}]*)\}")
_MESH_AXIS = re.compile(rf"\s*({_AXIS_NAME})\s*=\s*([0-9]+)\s*")
_AXIS_REF = re.compile(rf"\s*({_AXIS_NAME})\s*(?::\s*\(\s*([0-9]+)\s*\)\s*([0-9]+))?\s*")

# The parser's value reader stops at a comma outside brackets: the mesh form's device order
# follows one (`mesh[...], device_ids=(...) {...}`), so the parser reads on when this follows.
MESH_DEVICE_IDS = re.compile(r"[ \t]*,[ \t]*(?=device_ids\s*=)")


class ReplicaGroups(list):
    """The explicit groups of an iota or mesh form, which print back as that form (`compact_form`)."""

    def __init__(self, groups: list[list[int]], form: str) -> None:
        super().__init__(groups)
        self.form = " ".join(form.split())
        self._as_read = tuple(map(tuple, groups))

    def compact_form(self) -> str | None:
        """The form the groups were read from, or None when they were changed since."""
        return self.form if tuple(map(tuple, self)) == self._as_read else None


def format_replica_groups(groups: list[list[int]]) -> str:
    """HLO text of `groups`: the compact form they were read from, else explicit lists."""
    form = groups.compact_form() if isinstance(groups, ReplicaGroups) else None
    if form is not None:
        return form
    return "{" + ",".join("{" + ",".join(str(int(r)) for r in g) + "}" for g in groups) + "}"


def ints(body: str) -> list[int]:
    body = body.strip()
    if not body:
        return []
    parts = [p.strip() for p in body.split(",")]
    for p in parts:
        if not _INT.fullmatch(p):
            raise ValueError(f"expected an integer, got {p!r}")
    return [int(p) for p in parts]


def parse_int_groups(raw: str) -> list[list[int]]:
    if not _BRACED_GROUPS.fullmatch(raw):
        raise ValueError("expected {{i,j,...},...}")
    return [ints(g) for g in _GROUP.findall(raw[1:-1])]


def parse_replica_groups(raw: str) -> list[list[int]]:
    """Any of the three forms -> the explicit groups."""
    raw = raw.strip()
    if raw.startswith("mesh"):
        return ReplicaGroups(_mesh_groups(raw), raw)
    if raw.startswith("["):
        m = _IOTA.fullmatch(raw)
        if m is None:
            raise ValueError("expected iota replica groups [groups,group_size]<=[dims]T(perm)")
        groups = _iota_ids(ints(m.group(2)), m.group(3)).reshape(_group_dims(ints(m.group(1)))).tolist()
        return ReplicaGroups(groups, raw)
    return parse_int_groups(raw)


def _group_dims(dims: list[int]) -> list[int]:
    if len(dims) != 2:
        raise ValueError("iota replica groups need [groups,group_size]")
    return dims


def _checked_total(dims: list[int], form: str) -> int:
    total = math.prod(dims)
    ceiling = limits.current().max_replicas
    if total > ceiling or min(dims, default=0) < 0:
        raise ValueError(f"{form} replica groups over {limits.short_text(total)} devices: more than the "
                         f"ceiling of {ceiling} replicas, or a negative size")
    return total


def _iota_ids(reshape_dims: list[int], perm_text: str | None, into: list[int] | None = None) -> np.ndarray:
    """iota(prod(reshape_dims)) reshaped, transposed by `perm_text` (none: identity), flattened."""
    perm = ints(perm_text) if perm_text is not None else list(range(len(reshape_dims)))
    if sorted(perm) != list(range(len(reshape_dims))):
        raise ValueError("the transpose is not a permutation of the reshape dimensions")
    total = _checked_total(reshape_dims, "iota")
    if into is not None and total != math.prod(into):
        raise ValueError(f"{reshape_dims} holds {total} devices, not the {math.prod(into)} of {into}")
    return np.arange(total, dtype=np.int64).reshape(reshape_dims).transpose(perm).reshape(-1)


def _name(text: str) -> str:
    return text[1:-1] if text[:1] in "'\"" else text


def _mesh_groups(raw: str) -> list[list[int]]:
    m = _MESH.fullmatch(raw)
    if m is None:
        raise ValueError("expected mesh[name=size,...] {name,...} (optionally mesh[...], device_ids=(...) {...})")
    names: list[str] = []
    sizes: list[int] = []
    for part in m.group(1).split(","):
        axis = _MESH_AXIS.fullmatch(part)
        if axis is None:
            raise ValueError(f"bad mesh axis {part.strip()!r} (expected name=size)")
        names.append(_name(axis.group(1)))
        sizes.append(int(axis.group(2)))
    if len(set(names)) != len(names):
        raise ValueError(f"the mesh names an axis twice: {names}")
    total = _checked_total(sizes, "mesh")
    devices = _device_order(m.group(2), sizes, total)
    refs = [] if not m.group(3).strip() else [_axis_ref(p, names, sizes) for p in m.group(3).split(",")]
    return _groups(devices, sizes, refs)


def _device_order(text: str | None, sizes: list[int], total: int) -> np.ndarray:
    if text is None:
        return np.arange(total, dtype=np.int64)
    text = text.strip()
    iota = _IOTA_TILE.fullmatch(text)
    if iota is not None:
        return _iota_ids(ints(iota.group(1)), iota.group(2), into=sizes)
    ids = ints(text.replace("{", "").replace("}", ""))
    if sorted(ids) != list(range(total)):
        raise ValueError(f"device_ids must order the {total} devices 0..{total - 1}")
    return np.array(ids, dtype=np.int64)


_IOTA_TILE = re.compile(r"\[([0-9,\s]*)\](?:\s*T\(([0-9,\s]*)\))?")


def _axis_ref(text: str, names: list[str], sizes: list[int]) -> tuple[int, int, int]:
    """(mesh axis, pre-size, size) of `'a'` (the whole axis: pre-size 1) or `'a':(pre)size`."""
    m = _AXIS_REF.fullmatch(text)
    if m is None:
        raise ValueError(f"bad replica group axis {text.strip()!r} (expected name or name:(pre)size)")
    name = _name(m.group(1))
    if name not in names:
        raise ValueError(f"replica group axis {name!r} is not an axis of the mesh {names}")
    axis = names.index(name)
    if m.group(2) is None:
        return axis, 1, sizes[axis]
    pre, size = int(m.group(2)), int(m.group(3))
    if pre < 1 or size < 2 or sizes[axis] % (pre * size) != 0:
        raise ValueError(f"sub-axis {name}:({pre}){size} does not split the axis of size {sizes[axis]}")
    return axis, pre, size


def _groups(devices: np.ndarray, sizes: list[int], refs: list[tuple[int, int, int]]) -> list[list[int]]:
    """Split every mesh axis into the factors its references name (major first), then move the
    referenced factors last, in the order referenced: each row of what remains is one group."""
    dims: list[int] = []
    factor_of: dict[tuple[int, int, int], int] = {}
    for axis, full in enumerate(sizes):
        mine = sorted((r for r in refs if r[0] == axis), key=lambda r: r[1])
        covered = 1
        for ref in mine:
            _, pre, size = ref
            if pre < covered or pre % covered:
                raise ValueError(f"replica group axes overlap on mesh axis {axis}")
            if pre != covered:
                dims.append(pre // covered)
            factor_of[ref] = len(dims)
            dims.append(size)
            covered = pre * size
        if covered != full or not mine:
            dims.append(full // covered)
    if len(factor_of) != len(refs):
        raise ValueError("a replica group axis is named twice")
    grouped = [factor_of[r] for r in refs]
    order = [d for d in range(len(dims)) if d not in grouped] + grouped
    group_size = math.prod(dims[d] for d in grouped)
    return devices.reshape(dims).transpose(order).reshape(-1, group_size).tolist()
