"""Collectives inside compiled graphs: ``torch.ops._c10d_functional.*`` (what DTensor, FSDP2 and the functional
collectives API emit) lowered into the graph's one XLA program, so compute and communication fuse.

A graph with collectives runs as **one SPMD program over its process group's mesh**, the mesh the eager
collectives use (:func:`torchtpu_lab.distributed.collectives.mesh`): each rank's local input arrays are its
blocks of global arrays laid out along dim 0 (:func:`~torchtpu_lab.distributed.collectives.to_global`, no copy),
the lowered graph is the body of a ``shard_map`` that sees exactly the rank's local arrays, and each collective
node calls the same per-rank body the eager collective runs
(:func:`~torchtpu_lab.distributed.collectives.body`: ``psum``, ``all_gather``, ``psum_scatter``,
``all_to_all`` over the mesh axis). Every rank of the group must run the same compiled graph, as every rank
must call the same eager collective.

What is not lowered (the graph then runs eagerly, op by op, and its compile event says why): a group name this
process cannot resolve, a group that is not a ``tpu`` process group, collectives over groups on different
devices in one graph, uneven ``all_to_all_single`` splits, reduce ops the eager backend rejects (``PREMUL_SUM``,
``AVG`` on integers), and graph inputs that are not tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import torch

from ..distributed import collectives, watchdog
from .errors import NotLowerable

_c10d = torch.ops._c10d_functional


@dataclass(frozen=True)
class Group:
    """The process group a graph's collectives run over, as the compiled program needs it."""

    name: str
    devices: tuple  # each position's jax.Device (position = rank within the group)
    position: int  # this process's position
    ranks: tuple  # global ranks, by position
    timeout_s: float

    @property
    def size(self) -> int:
        return len(self.devices)

    def describe(self) -> str:
        return f"group {list(self.ranks)} ({self.size} x {self.devices[0].platform})"


def resolve(name) -> Group:
    """The tpu process group named ``name`` in this process, or :class:`NotLowerable` saying why not."""
    import torch.distributed as dist

    from ..distributed import process_group

    if not isinstance(name, str):
        raise NotLowerable(f"collective whose group is a {type(name).__name__}, not a group name")
    if not dist.is_available() or not dist.is_initialized():
        raise NotLowerable(f"collective on process group {name!r}, but torch.distributed is not initialised")
    try:
        pg = dist.distributed_c10d._resolve_process_group(name)
    except (RuntimeError, ValueError, KeyError) as e:
        raise NotLowerable(f"collective on process group {name!r}, which this process cannot resolve ({e})") from e
    if not isinstance(pg, process_group.TpuProcessGroup):
        raise NotLowerable(f"collective on process group {name!r} of backend {pg.name()!r}, not a tpu process group")
    return Group(name, pg.devices, pg.rank(), tuple(dist.get_process_group_ranks(pg)), pg.timeout_s)


def _reduce_op(name: str, dtype: torch.dtype) -> str:
    """The eager backend's name of a functional collective's reduce op; :class:`NotLowerable` for one the eager
    backend rejects, so running eagerly raises its error."""
    op = name.lower()
    if op not in collectives.REDUCE_OPS:
        raise NotLowerable(f"reduce op {name!r} (the tpu backend supports "
                           f"{', '.join(sorted(collectives.REDUCE_OPS))})")
    if op == "avg" and not (dtype.is_floating_point or dtype.is_complex):
        raise NotLowerable("ReduceOp.AVG on an integer tensor (eager raises the backend's error)")
    return op


def _meta(node):
    return node.meta["val"]


def _inputs(node) -> list:
    """The tensor input(s) of a collective node as metadata: a list for the ``*_coalesced`` ops."""
    first = node.args[0]
    return [_meta(x) for x in first] if isinstance(first, (list, tuple)) else [_meta(first)]


def _check_reduce(node, group: Group) -> None:
    for x in _inputs(node):
        _reduce_op(node.args[1], x.dtype)


def _check_size(node, group: Group) -> None:
    size = node.args[1] if "all_gather" in node.target._schema.name else node.args[2]
    if size != group.size:
        raise NotLowerable(f"{node.target} with group_size {size} on a group of {group.size}")


def _check_reduce_scatter(node, group: Group) -> None:
    _check_size(node, group)
    _check_reduce(node, group)
    for x in _inputs(node):
        if x.dim() == 0 or x.shape[0] % group.size:
            raise NotLowerable(f"reduce_scatter_tensor of shape {tuple(x.shape)} over {group.size} ranks")


def _check_all_to_all(node, group: Group) -> None:
    x, out_splits, in_splits = _meta(node.args[0]), node.args[1], node.args[2]
    n = group.size
    for splits in (in_splits, out_splits):
        if splits is not None and (x.dim() == 0 or x.shape[0] % n or any(s != x.shape[0] // n for s in splits)):
            raise NotLowerable(f"all_to_all_single with uneven splits (in {list(in_splits)}, out {list(out_splits)})")
    if x.dim() == 0 or x.shape[0] % n:
        raise NotLowerable(f"all_to_all_single of shape {tuple(x.shape)} over {n} ranks")


def _check_root(node, group: Group) -> None:
    if not 0 <= node.args[1] < group.size:
        raise NotLowerable(f"broadcast from position {node.args[1]} of a group of {group.size}")


def _gather(x, n: int):
    (g,) = collectives.body("all_gather", n, ())(x)  # (n,) + x.shape, concatenated along dim 0 as PyTorch does
    return g.reshape((-1,) + tuple(x.shape[1:]))


def _all_reduce(args, n: int) -> list:
    xs = args[0] if isinstance(args[0], (list, tuple)) else [args[0]]
    return list(collectives.body("all_reduce", n, (("op", args[1].lower()),))(*xs))


def _reduce_scatter(args, n: int) -> list:
    xs = args[0] if isinstance(args[0], (list, tuple)) else [args[0]]
    rs = collectives.body("reduce_scatter", n, (("op", args[1].lower()),))
    return [rs(x)[0] for x in xs]


def _lower_gather(args, n: int):
    return [_gather(x, n) for x in args[0]] if isinstance(args[0], (list, tuple)) else _gather(args[0], n)


#: op -> (check(node, group), raising NotLowerable at trace time; lower(args, group size) on traced values)
_LOWER: dict = {
    _c10d.wait_tensor.default: (None, lambda args, n: args[0]),  # the program's own data flow orders it
    _c10d.all_reduce.default: (_check_reduce, lambda args, n: _all_reduce(args, n)[0]),
    _c10d.all_reduce_coalesced.default: (_check_reduce, _all_reduce),
    _c10d.all_gather_into_tensor.default: (_check_size, _lower_gather),
    _c10d.all_gather_into_tensor_coalesced.default: (_check_size, _lower_gather),
    _c10d.reduce_scatter_tensor.default: (_check_reduce_scatter, lambda args, n: _reduce_scatter(args, n)[0]),
    _c10d.reduce_scatter_tensor_coalesced.default: (_check_reduce_scatter, _reduce_scatter),
    _c10d.all_to_all_single.default: (_check_all_to_all,
                                      lambda args, n: collectives.body("all_to_all", n, ())(args[0])[0]),
    _c10d.broadcast.default: (_check_root,
                              lambda args, n: collectives.body("broadcast", n, (("root", args[1]),))(args[0])[0]),
}
OPS = frozenset(_LOWER)
WAIT = _c10d.wait_tensor.default


def _group_name(node) -> str | None:
    """The ``group_name`` argument of a collective node; ``None`` for ``wait_tensor``, which has none."""
    for arg, value in zip(node.target._schema.arguments, node.args):
        if arg.name == "group_name":
            return value
    return None


def group_of(nodes) -> Group | None:
    """The one group the collective nodes among ``nodes`` run over (each checked: :class:`NotLowerable` for what
    cannot be lowered), or ``None`` when there are none."""
    group = None
    for node in nodes:
        if node.op != "call_function" or node.target not in _LOWER:
            continue
        name = _group_name(node)
        if name is None:
            continue
        g = resolve(name)
        if group is not None and (g.devices, g.position) != (group.devices, group.position):
            raise NotLowerable(f"collectives over two different groups in one graph ({group.describe()} and "
                               f"{g.describe()}); one program runs over one mesh")
        group = group or g
        check = _LOWER[node.target][0]
        if check is not None:
            check(node, g)
    return group


def lower(op, args: tuple, group: Group):
    """The traced value of a collective ``op`` node (inside the shard_map body: ``args`` are this rank's
    arrays and the node's other arguments)."""
    return _LOWER[op][1](args, group.size if group is not None else 1)  # no group: only wait_tensor


def program(fn: Callable, group: Group, scalar_inputs: tuple) -> Callable:
    """``fn`` (the lowered graph: local arrays -> tuple of local arrays) as one program over the group's mesh,
    a function of global arrays (:func:`as_global`). ``scalar_inputs``: which inputs are 0-d (their blocks have
    shape ``(1,)``)."""
    def per_rank(*blocks):
        return fn(*(b.reshape(()) if scalar else b for b, scalar in zip(blocks, scalar_inputs)))

    return collectives.over_mesh(per_rank, group.devices, len(scalar_inputs))


def as_global(inputs: list, group: Group) -> list:
    """This rank's inputs (arrays, or Python ints such as the RNG seed and counter) as its blocks of global
    arrays over the group's mesh."""
    device = group.devices[group.position]  # a host tensor's array may sit on the default device
    return collectives.to_global([jax.device_put(x, device) for x in inputs], group.devices)


def as_local(outs, scalar_outputs: tuple) -> list:
    """This rank's results from the program's global outputs (0-d results back to shape ``()``)."""
    return [o.reshape(()) if scalar else o for o, scalar in zip(collectives.to_local(outs), scalar_outputs)]


def run(group: Group, what: str, fn: Callable, args: list):
    """``fn(*args)`` waited for under the collective watchdog: if another rank never runs its part, this process
    ends naming the graph and group instead of hanging (a running XLA collective cannot be cancelled)."""
    return watchdog.run_and_wait(f"{what} on {group.describe()}", group.timeout_s, fn, *args)
