"""`rp.jax.jit`: JAX's calling model on replicas. Compile once per argument signature, keep the
program's job running between calls (shared by the functions jitted for the same replicas and
options under Ray), and keep outputs on the replicas as `rp.Array`s.

    step = rp.jax.jit(train_step, num_replicas=4, in_specs=(P(), P("x")), out_specs=(P(), P()))
    for batch in batches:
        params, loss = step(params, batch)     # params stay on the replicas; nothing moves
    print(float(loss))                         # gathered when asked

The cache key is what `jax.jit` keys on: the arguments' tree structure, each leaf's shape, dtype,
weak type and sharding, and the static arguments' values.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from replicas.caching import Cache
from replicas.errors import ProgramError
from replicas.hlo.jax_compiled import is_compiled
from replicas.jax.arguments import host_value, physical_dtype, physical_shape, signature_dtype
from replicas.jax.divergence import check_jax_outputs, checked_tolerance
from replicas.jax.program import JaxProgram, _indices, _jax, _output_leaves, compile_jax, run_compiled
from replicas.runtime.job import checked_executable
from replicas.runtime.options import LaunchOptions
from replicas.runtime.resident import Array, Kept, Resliced, gather_replicas, holders, same_index
from replicas.runtime.session import Session, shared_devices

# Options of a jitted function's job: every option of `rp.run` (`trace`: written when the job ends,
# runtime/session.py), and how closely replicated outputs must agree.
JOB_OPTIONS = (*LaunchOptions.__dataclass_fields__, "replicated_tolerance")
# Opcodes a jitted function's job cannot run: nothing feeds its replicas between calls.
HOST_FEEDS = frozenset({"infeed", "outfeed"})
CACHE_SIZE = 32  # compiled signatures kept per jitted function (least recently used dropped)


@dataclass
class Compiled:
    """One signature's program: JAX's compile, the replicas' executable, and the running job."""

    program: JaxProgram
    session: Session
    in_index: list[list[tuple]]  # per flattened argument: each replica's shard index
    out_index: list[list[tuple]]  # per flattened output
    donated: frozenset[int]  # flattened argument positions donated to the call
    # Per flattened output, what its `Array` is made of (computed once: a call only adds the shards).
    out_meta: list[tuple[tuple[int, ...], np.dtype, list[tuple], Any, tuple[int, ...]]]
    holders: list[tuple[int, ...]]  # per output: for each replica, the first replica holding an equal shard
    checked: bool  # some output is declared replicated: the replicas' copies are compared each call
    in_whole: list[bool]  # per flattened argument: every replica takes the whole value
    out_leaf: bool  # the function returns one array, not a tree of them
    evicted: bool = False  # dropped from the cache (its session closed): the quick path must not call it

    def evict(self) -> None:
        self.evicted = True
        self.session.close()


class JitFunction:
    """A JAX function jitted for replicas (see `jit`)."""

    def __init__(self, f: Callable[..., Any], *, num_replicas: int | None, mesh: Any, in_specs: Any,
                 out_specs: Any, axis_name: str, static_argnums: Sequence[int], donate_argnums: Sequence[int],
                 options: dict[str, Any]) -> None:
        unknown = sorted(set(options) - set(JOB_OPTIONS))
        if unknown:
            raise ProgramError(f"rp.jax.jit takes the job options {', '.join(JOB_OPTIONS)}; got {', '.join(unknown)}")
        self.fn = f
        self._num_replicas, self._mesh = num_replicas, mesh
        self._in_specs, self._out_specs, self._axis_name = in_specs, out_specs, axis_name
        self.static_argnums = tuple(sorted(_positions(static_argnums, "static_argnums")))
        self.donate_argnums = tuple(sorted(_positions(donate_argnums, "donate_argnums")))
        if set(self.static_argnums) & set(self.donate_argnums):
            raise ProgramError("an argument cannot be both static and donated")
        # Replicated outputs must agree (replicas/jax/divergence.py): bitwise, within this, or None: unchecked.
        self._tolerance = checked_tolerance(options.pop("replicated_tolerance", 0.0))
        self._options = LaunchOptions.of(**options)
        self._cache: Cache[Compiled] = Cache(f"rp.jax.jit {getattr(f, '__qualname__', f)}", CACHE_SIZE,
                                             on_evict=Compiled.evict)
        self._last: Compiled | None = None  # the signature called last (`progress`, `write_trace`)
        # The last signature's (quick key, compiled) when its arguments were plain arrays: the
        # next call of plain arrays of the same shapes and dtypes takes it without flattening a tree,
        # building the cache key or looking it up (most of a small program's call).
        self._quick: tuple[tuple, Compiled] | None = None
        functools.update_wrapper(self, f)

    # -- calling ----------------------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        quick = self._quick
        if quick is not None:
            compiled = quick[1]
            # The quick signature is always the cache's most recently used: its hits need no `get`.
            found = _quick_key(args, self._in_specs is not None)
            if found is not None and found[0] == quick[0] and not compiled.evicted:
                return self._call(compiled, found[1])
        jax = _jax()
        statics, dynamic = self._split_static(args)
        leaves, tree = jax.tree_util.tree_flatten(list(dynamic))
        by_specs = self._in_specs is not None  # shard_map's in_specs decide the shardings
        key = (tree, statics, tuple(_signature(leaf, by_specs) for leaf in leaves))
        compiled = self._cache.get(key)
        if compiled is None:
            compiled = self._compile(args, statics, dynamic, leaves, key)
        found = None if statics else _quick_key(args, by_specs)
        self._quick = None if found is None else (found[0], compiled)
        return self._call(compiled, leaves)

    def _call(self, compiled: Compiled, leaves: Sequence[Any]) -> Any:
        self._last = compiled
        per_replica = self._shards(compiled, leaves)
        seq, results = compiled.session.call(per_replica, len(compiled.out_meta), compiled.holders)
        if compiled.checked:
            check_jax_outputs(compiled.program, per_replica, results, self._tolerance)
        for i in compiled.donated:
            if isinstance(leaves[i], Array):
                leaves[i].delete()
        return self._outputs(compiled, seq, results)

    def _split_static(self, args: tuple) -> tuple[tuple, list[Any]]:
        statics, dynamic = [], []
        for i, a in enumerate(args):
            if i in self.static_argnums:
                try:
                    hash(a)
                except TypeError:
                    raise ProgramError(f"static argument {i} must be hashable, got {type(a).__name__}") from None
                statics.append((i, a))
            else:
                dynamic.append(a)
        return tuple(statics), dynamic

    def _compile(self, args: tuple, statics: tuple, dynamic: list[Any], leaves: list[Any], key: Hashable) -> Compiled:
        jax = _jax()
        fixed = dict(statics)
        positions = [i for i in range(len(args)) if i not in fixed]

        def bound(*dyn: Any) -> Any:
            full = dict(fixed)
            full.update(zip(positions, dyn))
            return self.fn(*(full[i] for i in range(len(args))))

        abstract = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(list(dynamic)),
                                                [_abstract(leaf, self._in_specs is not None) for leaf in leaves])
        donate = tuple(positions.index(i) for i in self.donate_argnums if i in positions)
        program = compile_jax(bound, *abstract, num_replicas=self._num_replicas, mesh=self._mesh,
                              in_specs=self._in_specs, out_specs=self._out_specs, axis_name=self._axis_name,
                              donate_argnums=donate)
        _refuse_host_feeds(program.module)
        n = program.num_replicas
        in_index: list[list[tuple]] = []
        for s, leaf in zip(program.in_shardings, leaves):  # equal placements are one list: `is` says they fit
            index = _indices(s, tuple(np.shape(leaf)), n)
            in_index.append(next((i for i in in_index if same_index(i, index)), index))
        out_index = [_indices(s, tuple(a.shape), n) for s, a in zip(program.out_shardings, program.out_avals)]
        # An output placed as some argument is the same list: passed back, one `is` says it fits.
        out_index = [next((i for i in in_index if same_index(i, o)), o) for o in out_index]
        out_meta = [(physical_shape(a.shape, a.dtype), np.dtype(physical_dtype(a.dtype)), index, sharding,
                     gather_replicas(index))
                    for a, index, sharding in zip(program.out_avals, out_index, program.out_shardings)]
        checked = self._tolerance is not None and n > 1 and any(
            s is None or getattr(s, "is_fully_replicated", False) for s in program.out_shardings)
        options = self._options
        options.checked(n)
        session = Session(checked_executable(program.module, n), shared_devices(n, options), options.timeout)
        owners = [j for j, a in enumerate(dynamic) for _ in jax.tree_util.tree_leaves(a)]
        donated = frozenset(i for i, j in enumerate(owners) if j in donate)
        in_whole = [all(all(s == slice(None) for s in ix) for ix in index) for index in in_index]
        out_leaf = program.out_tree.num_nodes == 1 and program.out_tree.num_leaves == 1
        compiled = Compiled(program, session, in_index, out_index, donated, out_meta, [holders(i) for i in out_index],
                            checked, in_whole, out_leaf)
        self._cache.put(key, compiled)
        return compiled

    def _shards(self, compiled: Compiled, leaves: Sequence[Any]) -> list[list[Any]]:
        """Each replica's arguments: a resident array's own shards, a host value's split."""
        n = compiled.program.num_replicas
        if n == 1:  # one replica takes every value whole
            row = []
            for i, (leaf, dtype) in enumerate(zip(leaves, compiled.program.arg_dtypes)):
                if type(leaf) is np.ndarray and leaf.dtype == dtype:
                    row.append(leaf)
                else:
                    row.append(self._leaf_shards(compiled, i, leaf)[0])
            return [row]
        per_replica: list[list[Any]] = [[] for _ in range(n)]
        for i, leaf in enumerate(leaves):
            for row, value in zip(per_replica, self._leaf_shards(compiled, i, leaf)):
                row.append(value)
        return per_replica

    def _leaf_shards(self, compiled: Compiled, i: int, leaf: Any) -> Sequence[Any]:
        """Each replica's part of argument `i`."""
        devices = compiled.session.devices
        n = compiled.program.num_replicas
        index, dtype = compiled.in_index[i], compiled.program.arg_dtypes[i]
        if type(leaf) is np.ndarray:  # the usual host argument: host_value's checks, inline
            value = leaf if leaf.dtype == dtype else leaf.astype(dtype)
        else:
            if isinstance(leaf, Array):
                leaf.check_alive(f"argument {i}")
                if leaf.dtype == dtype and (leaf.index is index or same_index(leaf.index, index)):
                    if leaf.home is devices and devices.holds(leaf.key):
                        return [Kept(leaf.key[1], leaf.key[2])] * n  # where it is: nothing moves
                    local = leaf.local_shards()
                    if local is not None:
                        return local
                elif leaf.dtype == dtype and leaf.home is devices and devices.holds_whole(leaf.key):
                    # placed otherwise, but every shard is in the one actor: it cuts each replica's part
                    sources = tuple((q, leaf.index[q]) for q in gather_replicas(leaf.index))
                    call, output = leaf.key[1], leaf.key[2]
                    return [Resliced(call, output, leaf.shape, sources, index[p]) for p in range(n)]
                leaf = leaf.value()
            value = host_value(leaf, dtype)
        if compiled.in_whole[i]:
            return [value] * n
        return [np.ascontiguousarray(value[index[p]]) for p in range(n)]

    def _outputs(self, compiled: Compiled, seq: int, results: list[Any]) -> Any:
        devices = compiled.session.devices
        meta = compiled.out_meta
        if devices.resident:
            outputs = []
            job = devices.job
            for i, (shape, dtype, index, sharding, gather) in enumerate(meta):
                here: list[Any] | None = []  # the shards, when they came back with the reply
                for part in results:
                    shard = part[i]
                    if shard is None:
                        here = None
                        break
                    here.append(shard)
                outputs.append(Array.made(shape, dtype, index, here, devices, (job, seq, i), sharding, gather))
        else:  # every replica's outputs are here
            per_replica = [_output_leaves(r, len(meta)) for r in results]
            columns = [[leaves[i]] for leaves in per_replica for i in range(len(meta))] if len(results) == 1 \
                else [list(c) for c in zip(*per_replica)]
            outputs = [Array.made(shape, dtype, index, shards, devices, None, sharding, gather)
                       for (shape, dtype, index, sharding, gather), shards in zip(meta, columns)]
        return outputs[0] if compiled.out_leaf else compiled.program.out_tree.unflatten(outputs)

    # -- what a one-shot job offers ----------------------------------------------------------------
    def _last_session(self) -> Session:
        if self._last is None:
            raise ProgramError("the function has not been called yet: nothing runs")
        return self._last.session

    def progress(self) -> Any:
        """The `Progress` of the running call (from any thread: elapsed time, replicas running,
        blocked and finished, the slowest replica's instruction, ...), or of the last call, on the
        job this function runs on (under Ray, the job the functions jitted for the same replicas and
        options share: the call may be another one's)."""
        return self._last_session().devices.progress()

    def write_trace(self, path: str) -> None:
        """The last called signature's job's flight recorders (each replica's last `trace_events`
        events, across calls) as a Chrome trace at `path` (`trace=` writes it when the job ends)."""
        from replicas.runtime.arguments import check_trace_path

        check_trace_path(path)
        self._last_session().devices.write_trace(path)

    # -- introspection ----------------------------------------------------------------------------
    def cache_size(self) -> int:
        """How many argument signatures have been compiled (and are kept)."""
        return len(self._cache)

    def end_jobs(self) -> None:
        """End the jobs of the compiled signatures, keeping the compiles (the next call starts a job).
        Under Ray that job is shared by the functions jitted for the same replicas and options: the
        arrays they left on the replicas go with it."""
        for c in self._cache.values():
            c.session.devices.close()

    def close(self) -> None:
        """Forget the compiles; their job ends unless another function's programs or an array still
        use it (under Ray, the functions jitted for the same replicas and options share one)."""
        self._cache.clear()
        self._last = self._quick = None


def jit(f: Callable[..., Any] | None = None, *, num_replicas: int | None = None, mesh: Any = None,
        in_specs: Any = None, out_specs: Any = None, axis_name: str = "x", static_argnums: Sequence[int] = (),
        donate_argnums: Sequence[int] = (), **options: Any) -> Any:
    """`jax.jit` for replicas: `rp.jax.jit(f, num_replicas=4, in_specs=..., out_specs=...)(*args)`.

    Compiles once per argument signature and keeps the program's job running (under Ray one job for
    every function jitted for the same replicas and options, as JAX's functions share the devices);
    returns the outputs as `rp.Array`s that stay on the replicas (pass them to the next call, of
    this function or another; `np.asarray` gathers).
    num_replicas / mesh / in_specs / out_specs / axis_name: as `rp.jax.run` (`in_specs` covers the
        arguments that are not static).
    static_argnums: arguments that are compile-time constants (hashable; a new value compiles again).
    donate_argnums: arguments given away: an `rp.Array` passed there is deleted by the call.
    options: the job's `rp.run` options (backend="ray" | "threads", timeout, strict, ...); `trace=` is
        written when the job ends (`close()`, a failed call) and `write_trace(path)` writes it at any
        time; `progress=True` shows the live status while the monitor watches a call (one that did
        not end within the backend's poll interval); `progress()` gives it as data, from any thread.
    A program with Infeed, Outfeed or host transfers is refused (nothing feeds a job between calls:
    `rp.launch` runs it); Ctrl-C ends the running call and its job, as it ends a `rp.run`.
    Used as a decorator with keyword arguments only: `@rp.jax.jit(num_replicas=4, ...)`.
    """
    if f is None:
        return lambda g: jit(g, num_replicas=num_replicas, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                             axis_name=axis_name, static_argnums=static_argnums, donate_argnums=donate_argnums,
                             **options)
    return JitFunction(f, num_replicas=num_replicas, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                       axis_name=axis_name, static_argnums=static_argnums, donate_argnums=donate_argnums,
                       options=options)


# `rp.jax.run`'s jitted functions, by function and options (least recently used dropped).
_RUN_CACHE: Cache[JitFunction] = Cache("rp.jax.run functions", CACHE_SIZE, on_evict=lambda old: old.close())


def cached_jit(f: Callable[..., Any], *, num_replicas: int | None, mesh: Any, in_specs: Any, out_specs: Any,
               axis_name: str, options: dict[str, Any]) -> JitFunction | None:
    """The jitted function `rp.jax.run` calls for these options; None when they cannot be a key."""
    key = (f, num_replicas, mesh, in_specs, out_specs, axis_name, tuple(sorted(options.items())))
    try:
        hash(key)
    except TypeError:
        return None
    return _RUN_CACHE.get_or_make(key, lambda: JitFunction(
        f, num_replicas=num_replicas, mesh=mesh, in_specs=in_specs, out_specs=out_specs, axis_name=axis_name,
        static_argnums=(), donate_argnums=(), options=dict(options)))


def _refuse_host_feeds(module: Any) -> None:
    """A ProgramError naming the first instruction that would wait for the host between calls."""
    for _, inst in module.instructions():
        if inst.opcode in HOST_FEEDS or (inst.opcode in ("send", "recv") and inst.attrs.get("is_host_transfer")):
            raise ProgramError(f"rp.jax.jit cannot run %{inst.name} ({inst.opcode}): a jitted function's job takes "
                               f"no host feeds or host transfers between calls; run the program with rp.launch "
                               f"(job.infeed, job.outfeed, job.send, job.recv)")


def _positions(numbers: Sequence[int] | int, what: str) -> set[int]:
    if isinstance(numbers, int):
        numbers = (numbers,)
    out = set()
    for k in numbers:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise ProgramError(f"{what} must be non-negative argument positions, got {k!r}")
        out.add(int(k))
    return out


def _quick_key(args: tuple, by_specs: bool) -> tuple[tuple, list[Any]] | None:
    """(key, leaves) when the arguments are numpy arrays (or, `by_specs`, `rp.Array`s, whose signature
    is then the same) in tuples and lists, else None: the key holds each array's shape and dtype and
    each container's type and length, in the order of the tree's leaves, so equal quick keys are
    equal cache keys (`_signature` reads only these of such leaves)."""
    key: list[Any] = []
    leaves: list[Any] = []
    if not _quick_walk(args, by_specs, key, leaves):
        return None
    return tuple(key), leaves


def _quick_walk(items: Sequence[Any], by_specs: bool, key: list[Any], leaves: list[Any]) -> bool:
    for a in items:
        t = type(a)
        if t is np.ndarray or (t is Array and by_specs):
            key.append(a.shape)  # a tuple: never equal to a container's type below
            key.append(a.dtype)
            leaves.append(a)
        elif t is tuple or t is list:
            key.append(t)
            key.append(len(a))
            if not _quick_walk(a, by_specs, key, leaves):
                return False
        else:
            return False
    return True


def _signature(leaf: Any, by_specs: bool) -> Hashable:
    """What jax.jit keys a leaf on: shape, dtype, weak type, sharding (`by_specs`: the function's
    in_specs decide every argument's sharding: not part of the key)."""
    if isinstance(leaf, Array):
        return (leaf.shape, leaf.dtype, False, None if by_specs else _sharding_key(leaf.sharding))
    if isinstance(leaf, np.ndarray):
        return (leaf.shape, leaf.dtype, False, None)
    if isinstance(leaf, (bool, int, float, complex)):
        return ((), type(leaf), True, None)
    sharding = getattr(leaf, "sharding", None)
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return (tuple(leaf.shape), signature_dtype(leaf.dtype), bool(getattr(leaf, "weak_type", False)),
                _sharding_key(sharding) if _is_partitioned(sharding) and not by_specs else None)
    value = np.asarray(leaf)
    return (value.shape, value.dtype, False, None)


def _sharding_key(sharding: Any) -> Hashable:
    if sharding is None:
        return None
    try:
        hash(sharding)
        return sharding
    except TypeError:
        return repr(sharding)


def _is_partitioned(sharding: Any) -> bool:
    return sharding is not None and len(getattr(sharding, "device_set", ())) > 1


def _abstract(leaf: Any, by_specs: bool = False) -> Any:
    """The `jax.ShapeDtypeStruct` a leaf lowers as (`by_specs`: without its sharding, which the
    function's in_specs replace, so an array of another mesh is taken as its global value)."""
    jax = _jax()
    if isinstance(leaf, Array):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
    if isinstance(leaf, (bool, int, float, complex)):
        return jax.ShapeDtypeStruct((), jax.numpy.asarray(leaf).dtype, weak_type=True)
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype") and not isinstance(leaf, np.ndarray):
        sharding = getattr(leaf, "sharding", None)
        return jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype, weak_type=bool(getattr(leaf, "weak_type", False)),
                                    sharding=sharding if _is_partitioned(sharding) and not by_specs else None)
    value = np.asarray(leaf)
    dtype = jax.numpy.asarray(np.zeros((), value.dtype)).dtype  # JAX's (x64 off: int64 -> int32)
    return jax.ShapeDtypeStruct(value.shape, dtype)


def run(f: Callable[..., Any], *args: Any, num_replicas: int | None = None, mesh: Any = None,
        in_specs: Any = None, out_specs: Any = None, axis_name: str = "x", **options: Any) -> Any:
    """Run the JAX function `f` on replicas and return its global outputs, as `jax.jit(f)(*args)` would.

    num_replicas / mesh: how many replicas (a one-axis mesh named `axis_name`), or the mesh itself.
    in_specs / out_specs: `shard_map` specs; given, `f` runs as `shard_map(f, mesh, in_specs, out_specs)`.
    options: every `rp.run` option (backend="threads" | "ray", timeout, address, trace, strict, ...).
    A function run again with arguments of the same shapes is not compiled again (`rp.jax.jit`
    keeps the job running as well, and the outputs on the replicas).
    """
    if is_compiled(f):  # jax.jit(g).lower(...).compile(): its own shardings, global arguments
        return run_compiled(f, args, options)
    if set(options) <= set(JOB_OPTIONS):
        jitted = cached_jit(f, num_replicas=num_replicas, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                            axis_name=axis_name, options=options)
        if jitted is not None:
            try:
                outputs = jitted(*args)
                jax = _jax()
                return jax.tree_util.tree_map(lambda a: np.array(a.value()), outputs)
            finally:
                jitted.end_jobs()
    from replicas.runtime.driver import run as run_module

    program = compile_jax(f, *args, num_replicas=num_replicas, mesh=mesh, in_specs=in_specs,
                          out_specs=out_specs, axis_name=axis_name)
    options.pop("replicated_tolerance", None)  # checked by rp.jax.jit's calls only
    results = run_module(program.module, program.split(args), program.num_replicas, **options)
    return program.join(results)


def replicated(num_replicas: int | None = None, *, mesh: Any = None, in_specs: Any = None, out_specs: Any = None,
               axis_name: str = "x", **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator form of `run`: `@rp.jax.replicated(4, in_specs=(P("x"),), out_specs=P())`."""

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def on_replicas(*args: Any) -> Any:
            return run(f, *args, num_replicas=num_replicas, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                       axis_name=axis_name, **options)

        return on_replicas

    return decorate
