"""Each collective is one compiled XLA program over a mesh of the participating ranks' devices.

A collective over a group of ``n`` ranks sees each rank's local array ``x`` (shape ``(k, ...)``) as one block
of a global array of shape ``(n * k, ...)`` laid out one block per device on the mesh ``Mesh(devices, ("r",))``
(``jax.make_array_from_single_device_arrays``: no data moves or is copied to build it). The program is a
``shard_map`` whose body receives the block, calls a ``jax.lax`` collective over the axis ``"r"`` (``psum``, ``pmax``,
``all_gather``, ``psum_scatter``, ``all_to_all``, ``ppermute``) and returns this rank's result as a block of a
global output, from which each rank takes its own shard. XLA lowers those to ICI/DCN collectives on a TPU
slice, NCCL on GPUs and Gloo between CPU processes: we write no transport.

Programs are jitted once per signature (kind, group, shapes, dtypes, static arguments) and kept in the bounded
``collectives`` cache; JAX's persistent compilation cache serves them across restarts like every other
executable. Every rank of a group must call the same collective with the same signature (as with NCCL).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .. import caches

AXIS = "r"

_programs = caches.cache("collectives", 256, code=True)
_meshes = caches.cache("collective_meshes", 64)

#: Reductions with a native XLA collective; the others gather and reduce locally.
_NATIVE = {"sum": jax.lax.psum, "max": jax.lax.pmax, "min": jax.lax.pmin}
_LOCAL = {
    "sum": lambda g: jnp.sum(g, axis=0, dtype=g.dtype),
    "product": lambda g: jnp.prod(g, axis=0, dtype=g.dtype),
    "max": lambda g: jnp.max(g, axis=0),
    "min": lambda g: jnp.min(g, axis=0),
    "band": lambda g: functools.reduce(jnp.bitwise_and, list(g)),
    "bor": lambda g: functools.reduce(jnp.bitwise_or, list(g)),
    "bxor": lambda g: functools.reduce(jnp.bitwise_xor, list(g)),
}
REDUCE_OPS = frozenset(_LOCAL) | {"avg"}


def mesh(devices: tuple) -> Mesh:
    """The one-axis mesh over ``devices`` (position = rank within the group)."""
    m = _meshes.get(devices)
    if m is None:
        m = Mesh(np.array(devices, dtype=object), (AXIS,))
        _meshes.put(devices, m)
    return m


def _reduce(x, op: str, n: int):
    """``x`` reduced over the group with ``op`` (inside the shard_map body)."""
    if op == "avg":
        return (jax.lax.psum(x, AXIS) / n).astype(x.dtype)
    if x.dtype == jnp.bool_:
        return _reduce(x.astype(jnp.int32), op, n).astype(jnp.bool_)
    if op in _NATIVE:
        return _NATIVE[op](x, AXIS)
    return _LOCAL[op](jax.lax.all_gather(x, AXIS))


def _from(x, root: int):
    """Root's ``x`` on every rank (a masked sum: only the root contributes, so the values are exact)."""
    keep = jax.lax.axis_index(AXIS) == root
    if x.dtype == jnp.bool_:
        return jax.lax.psum(jnp.where(keep, x, False).astype(jnp.int32), AXIS).astype(jnp.bool_)
    return jax.lax.psum(jnp.where(keep, x, jnp.zeros_like(x)), AXIS)


def body(kind: str, n: int, params: tuple) -> Callable:
    """The per-rank function of one collective kind (takes and returns tuples of per-rank arrays). Public because
    compiled graphs (:mod:`torchtpu_lab.compile.spmd`) call the same bodies inside their own ``shard_map``."""
    p = dict(params)
    if kind == "all_reduce":
        return lambda *xs: tuple(_reduce(x, p["op"], n) for x in xs)
    if kind == "all_gather":  # S per rank -> (n,) + S
        return lambda x: (jax.lax.all_gather(x, AXIS),)
    if kind == "reduce_scatter":  # (n*k, ...) per rank -> (k, ...)
        op = p["op"]
        if op in ("sum", "avg"):
            def rs(x):
                out = jax.lax.psum_scatter(x, AXIS, scatter_dimension=0, tiled=True)
                return ((out / n).astype(x.dtype) if op == "avg" else out,)
            return rs

        def rs_general(x):
            k = x.shape[0] // n
            full = _reduce(x, op, n)
            return (jax.lax.dynamic_slice_in_dim(full, jax.lax.axis_index(AXIS) * k, k, 0),)
        return rs_general
    if kind == "broadcast":
        return lambda *xs: tuple(_from(x, p["root"]) for x in xs)
    if kind == "scatter":  # root's (n, ...) stack -> row r on rank r
        def scatter(x):
            return (jax.lax.dynamic_index_in_dim(_from(x, p["root"]), jax.lax.axis_index(AXIS), 0, keepdims=False),)
        return scatter
    if kind == "all_to_all":  # (n*k, ...) per rank: chunk j goes to rank j
        return lambda x: (jax.lax.all_to_all(x, AXIS, 0, 0, tiled=True),)
    if kind == "permute":  # send/recv: rank pairs (source, destination) within the group
        return lambda x: (jax.lax.ppermute(x, AXIS, perm=list(p["pairs"])),)
    raise ValueError(f"unknown collective {kind!r}")


def over_mesh(per_rank: Callable, devices: tuple, n_inputs: int) -> Callable:
    """``per_rank`` (this rank's blocks -> a tuple of result blocks) as a function of global arrays laid out one
    block per device of ``mesh(devices)`` along dim 0 (see :func:`to_global`). 0-d results come back as shape
    ``(1,)``: a block needs a dim to be laid out along. Not jitted: the caller jits or compiles it."""
    def blocks_out(*blocks):
        return tuple(o if o.ndim else o[None] for o in per_rank(*blocks))

    return jax.shard_map(blocks_out, mesh=mesh(devices), in_specs=tuple(P(AXIS) for _ in range(n_inputs)),
                         out_specs=P(AXIS), check_vma=False)


def program(kind: str, devices: tuple, avals: tuple, params: tuple) -> Callable:
    """The compiled collective for this signature: takes global arrays, returns global arrays."""
    key = (kind, devices, avals, params)
    fn = _programs.get(key)
    if fn is None:
        fn = jax.jit(over_mesh(body(kind, len(devices), params), devices, len(avals)))
        _programs.put(key, fn)
    return fn


def to_global(arrays: Sequence[jax.Array], devices: tuple) -> list:
    """This rank's arrays (each on its own device of ``devices``) as its blocks of global arrays over
    ``mesh(devices)``: the global array concatenates the ranks' arrays along dim 0, so each rank's buffer is its
    block as it is (no copy). A 0-d array is viewed as shape ``(1,)`` first."""
    n = len(devices)
    sharding = NamedSharding(mesh(devices), P(AXIS))
    arrays = [a if a.ndim else a.reshape((1,)) for a in arrays]
    return [jax.make_array_from_single_device_arrays((n * a.shape[0],) + tuple(a.shape[1:]), sharding, [a])
            for a in arrays]


def to_local(outs: Sequence[jax.Array]) -> list:
    """This rank's blocks of global results (the inverse of :func:`to_global`, 0-d results as shape ``(1,)``)."""
    return [o.addressable_shards[0].data for o in outs]


def run(kind: str, devices: tuple, position: int, arrays: Sequence[jax.Array], params: tuple = ()) -> list:
    """Run collective ``kind`` among ``devices``; this process is at ``position`` and contributes ``arrays``
    (each already on ``devices[position]``). Returns this rank's output arrays (dispatched, not waited for)."""
    globals_ = to_global(arrays, devices)
    avals = tuple((tuple(a.shape), str(a.dtype)) for a in globals_)
    return to_local(program(kind, devices, avals, params)(*globals_))


def cache_size() -> int:
    return len(_programs)
