"""The ``tpu`` process group: ``torch.distributed``'s collectives on tpu tensors, as compiled XLA collectives.

:class:`TpuProcessGroup` is a Python ``torch.distributed.ProcessGroup`` (the same extension point PyTorch's own
threaded test backend uses), so both ``dist.all_reduce(t)`` and the functional collectives DTensor and FSDP2
use (``torch.ops._c10d_functional.*``, which call the group from C++) reach it. Each method reads its input
tensors' device arrays (a sync point in fused mode: pending work runs first, recorded as reason
``collective``), runs the compiled program from :mod:`.collectives` and writes the results into the output
tensors. CPU tensors are accepted too (PyTorch itself sends some: DDP's parameter-shape check, object
collectives); they are copied to this rank's device and back.

**Work objects.** A collective has completed when its method returns (each waits for its XLA program under
the :mod:`.watchdog`); ``async_op=True`` gives a ``Work`` whose ``wait()`` returns at once. This loses
compute/communication overlap, which on XLA would come from scheduling collectives inside one compiled
program rather than from streams.

**Telemetry.** Each collective is an event ``collective`` (name = kind; bytes, participants, group, wall time
including the wait, the user line) and counts ``collective:<kind>`` and ``collective_bytes``; a profile groups
them and ``metrics_report()`` counts them.
"""

from __future__ import annotations

import time
from collections import deque
from datetime import timedelta

import jax
import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from .. import dtypes, telemetry
from ..device import tensor
from ..runtime import values
from ..telemetry import SyncReason
from . import collectives, watchdog, world

#: Recent collectives (kind, bytes, participants, seconds), for the metrics report; bounded.
collective_log: deque = deque(maxlen=2000)


def _op_name(op) -> str:
    name = getattr(op, "op", op).name.lower()
    if name not in collectives.REDUCE_OPS:
        raise NotImplementedError(f"tpu process group: reduce op {name.upper()} is not supported "
                                  f"(supported: {', '.join(sorted(o.upper() for o in collectives.REDUCE_OPS))})")
    return name


class CollectiveError(RuntimeError):
    """A collective failed (typically: another rank died and the transport reported it)."""


def _guarded(what: str, timeout_s: float, fn, *args) -> list:
    """Run and wait for one collective; a failure or timeout names it (kind, group, user line)."""
    try:
        return watchdog.run_and_wait(what, timeout_s, fn, *args)
    except (RuntimeError, ValueError) as e:
        if isinstance(e, CollectiveError):
            raise
        raise CollectiveError(f"{what} failed: {e}") from e


def _done(result) -> dist.Work:
    fut = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


class TpuProcessGroup(dist.ProcessGroup):
    """One group of ranks; position ``i`` in the group runs on ``world.devices[ranks[i]]``."""

    def __init__(self, rank: int, size: int, ranks: tuple[int, ...], timeout: timedelta, name: str = "tpu"):
        super().__init__(rank, size)
        self._backend_name = name  # the backend name it was created under ("tpu" or TorchTPU's "tpu_dist")
        self._rank = rank
        self._size = size
        self._ranks = ranks
        self._devices = tuple(world.require().devices[r] for r in ranks)
        self._timeout_s = timeout.total_seconds()
        self._device = self._devices[rank]
        self._name = self._desc = ""

    # --- identity -------------------------------------------------------------------------------------
    @property
    def devices(self) -> tuple:
        """The JAX device of each position in the group (what a collective's mesh is built over)."""
        return self._devices

    @property
    def timeout_s(self) -> float:
        """Seconds a collective of this group may take before the watchdog ends the process."""
        return self._timeout_s

    def getBackendName(self) -> str:
        return self._backend_name

    def rank(self) -> int:
        return self._rank

    # PyTorch stores a group's name and description on its C++ backends; a Python group keeps its own.
    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        return self._name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_desc(self) -> str:
        return self._desc

    def size(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"TpuProcessGroup(rank {self._rank} of {self._size}, global ranks {list(self._ranks)})"

    # --- moving data ----------------------------------------------------------------------------------
    def _array(self, t: torch.Tensor) -> jax.Array:
        if tensor.on_tpu(t):
            return values.value(t, SyncReason.COLLECTIVE, record=True, host_read=False)
        return jax.device_put(np.ascontiguousarray(dtypes.host_array(t.detach())), self._device)

    def _write(self, t: torch.Tensor, array) -> None:
        if tuple(array.shape) != tuple(t.shape):
            array = array.reshape(tuple(t.shape))
        if tensor.on_tpu(t):
            t = tensor.adopt(t)
            if array.dtype != dtypes.to_jax(t.dtype):
                array = array.astype(dtypes.to_jax(t.dtype))
            # as a tpu tensor, the result replaces a whole destination's buffer without a copy
            values.assign(t, tensor.from_array(array, t.dtype, t.tpu_storage.device_index))
        else:
            with torch.no_grad():
                t.detach().copy_(dtypes.host_tensor(np.asarray(array), t.dtype))

    def _run(self, kind: str, inputs: list, params: tuple = (), label: str | None = None) -> list:
        """Run one collective of the whole group on ``inputs`` (tensors or arrays)."""
        arrays = [x if isinstance(x, jax.Array) else self._array(x) for x in inputs]
        return self._execute(label or kind, kind, self._devices, self._rank, arrays, params, self._ranks)

    def _execute(self, name: str, kind: str, devices: tuple, position: int, arrays: list, params: tuple,
                 ranks: tuple) -> list:
        """Run the program, wait for it under the watchdog (errors and timeouts name it), record the event."""
        t0 = time.perf_counter()
        source = telemetry.user_source(4)
        what = f"{name} on group {list(ranks)} (called at {telemetry.describe(source)})"
        outs = _guarded(what, self._timeout_s, collectives.run, kind, devices, position, arrays, params)
        dur = time.perf_counter() - t0
        nbytes = sum(a.size * a.dtype.itemsize for a in arrays)
        telemetry.count(f"collective:{name}")
        telemetry.count("collective_bytes", nbytes)
        collective_log.append((name, nbytes, len(ranks), dur))
        telemetry.emit("collective", name, t=t0, dur=dur, nbytes=nbytes, source=source, participants=len(ranks),
                       group=ranks)
        return outs

    # --- all-reduce family ----------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        op = _op_name((opts or dist.AllreduceOptions()).reduceOp)
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        if op == "avg" and any(not (t.is_floating_point() or t.is_complex()) for t in tensors):
            raise TypeError("all_reduce with ReduceOp.AVG needs floating-point tensors (as NCCL does)")
        outs = self._run("all_reduce", tensors, (("op", op),))
        for t, o in zip(tensors, outs):
            self._write(t, o)
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts or dist.AllreduceCoalescedOptions())

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        op = _op_name(opts.reduceOp)
        outs = self._run("all_reduce", list(tensors), (("op", op),), label="reduce")
        if self._rank == opts.rootRank:
            for t, o in zip(tensors, outs):
                self._write(t, o)
        return _done(tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _op_name((opts or dist.ReduceScatterOptions()).reduceOp)
        if input.shape[0] != output.shape[0] * self._size:
            raise ValueError(f"reduce_scatter_tensor: input dim 0 ({input.shape[0]}) must be world size "
                             f"({self._size}) x output dim 0 ({output.shape[0]})")
        (out,) = self._run("reduce_scatter", [input], (("op", op),), label="reduce_scatter_tensor")
        self._write(output, out)
        return _done([output])

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter(self, outputs, input_lists, opts=None):
        for output, inputs in zip(outputs, input_lists):
            stacked = torch.cat([t.reshape((1,) + tuple(t.shape)) if t.dim() == 0 else t for t in inputs])
            self._reduce_scatter_base(output if output.dim() else output.reshape(1), stacked, opts)
        return _done(outputs)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self._reduce_scatter_base(o, i, opts)
        return _done(outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # --- all-gather family ----------------------------------------------------------------------------
    def _gathered(self, input, label: str):
        """All ranks' ``input`` stacked along a new leading axis: an array of shape ``(n,) + input.shape``."""
        (out,) = self._run("all_gather", [input], label=label)
        return out

    def _allgather_base(self, output, input, opts=None):
        if output.numel() != input.numel() * self._size:
            raise ValueError(f"all_gather_into_tensor: output has {output.numel()} elements, expected world size "
                             f"({self._size}) x {input.numel()}")
        self._write(output, self._gathered(input, "all_gather_into_tensor"))
        return _done([output])

    all_gather_single = _allgather_base

    def allgather(self, output_lists, inputs, opts=None):
        for outputs, input in zip(output_lists, inputs):
            g = self._gathered(input, "all_gather")
            for i, o in enumerate(outputs):
                self._write(o, g[i])
        return _done(output_lists)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self._allgather_base(o, i, opts)
        return _done(outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        return self.allgather(output_lists, inputs, opts)

    def gather(self, output_lists, inputs, opts=None):
        root = (opts or dist.GatherOptions()).rootRank
        g = self._gathered(inputs[0], "gather")
        if self._rank == root:
            for i, o in enumerate(output_lists[0]):
                self._write(o, g[i])
        return _done(output_lists)

    # --- one-to-all -----------------------------------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        root = (opts or dist.BroadcastOptions()).rootRank
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        outs = self._run("broadcast", tensors, (("root", root),))
        if self._rank != root:
            for t, o in zip(tensors, outs):
                self._write(t, o)
        return _done(tensors)

    def scatter(self, outputs, input_lists, opts=None):
        root = (opts or dist.ScatterOptions()).rootRank
        out = outputs[0]
        if self._rank == root:
            stacked = jax.numpy.stack([self._array(t) for t in input_lists[0]])
        else:  # only the root's values count; the others send zeros of the same signature
            stacked = jax.device_put(np.zeros((self._size,) + tuple(out.shape), dtypes.to_jax(out.dtype)),
                                     self._device)
        (res,) = self._run("scatter", [stacked], (("root", root),))
        self._write(out, res)
        return _done(outputs)

    # --- all-to-all -----------------------------------------------------------------------------------
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n = self._size
        if not output_split_sizes and not input_split_sizes:
            if input.shape[0] % n:
                raise ValueError(f"all_to_all_single: input dim 0 ({input.shape[0]}) is not divisible by the "
                                 f"world size ({n})")
            (res,) = self._run("all_to_all", [input], label="all_to_all_single")
            self._write(output, res)
            return _done([output])
        # Uneven splits: pad every chunk to the largest split of any rank (agreed with one small all-reduce).
        ins = list(input_split_sizes) or [input.shape[0] // n] * n
        outs_sizes = list(output_split_sizes) or [output.shape[0] // n] * n
        local_max = np.array([max(ins + outs_sizes)], np.int64)
        (m,) = self._run("all_reduce", [jax.device_put(local_max, self._device)], (("op", "max"),),
                         label="all_to_all_single(split sizes)")
        width = int(np.asarray(m)[0])
        a = self._array(input)
        rest = tuple(a.shape[1:])
        chunks, start = [], 0
        for k in ins:
            c = a[start:start + k]
            chunks.append(jax.numpy.pad(c, [(0, width - k)] + [(0, 0)] * len(rest)))
            start += k
        (res,) = self._run("all_to_all", [jax.numpy.concatenate(chunks)], label="all_to_all_single")
        pieces = [res[j * width: j * width + k] for j, k in enumerate(outs_sizes)]
        self._write(output, jax.numpy.concatenate(pieces))
        return _done([output])

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def alltoall(self, outputs, inputs, opts=None):
        shapes = {tuple(t.shape) for t in list(inputs) + list(outputs)}
        if len(shapes) != 1:
            raise NotImplementedError("all_to_all on the tpu backend needs tensors of one shape on every rank "
                                      f"(got {sorted(shapes)})")
        stacked = jax.numpy.stack([self._array(t) for t in inputs])
        (res,) = self._run("all_to_all", [stacked], label="all_to_all")
        for j, o in enumerate(outputs):
            self._write(o, res[j])
        return _done(outputs)

    # --- synchronisation and point-to-point -----------------------------------------------------------
    def barrier(self, opts=None):
        self._run("all_reduce", [jax.device_put(np.ones((1,), np.int32), self._device)], (("op", "sum"),),
                  label="barrier")
        return _done([])

    def _permute(self, t: torch.Tensor, src: int, dst: int, label: str):
        """A two-rank program on the mesh (src, dst): ``src``'s tensor arrives in ``dst``'s."""
        devices = (self._devices[src], self._devices[dst])
        pos = 0 if self._rank == src else 1
        ranks = (self._ranks[src], self._ranks[dst])
        outs = self._execute(label, "permute", devices, pos, [self._array(t)], (("pairs", ((0, 1),)),), ranks)
        return outs[0]

    def send(self, tensors, dst: int, tag: int = 0):
        if dst == self._rank:
            raise ValueError("send: destination is this rank")
        self._permute(tensors[0], self._rank, dst, "send/recv")
        return _done(tensors)

    def recv(self, tensors, src: int, tag: int = 0):
        if src == self._rank:
            raise ValueError("recv: source is this rank")
        self._write(tensors[0], self._permute(tensors[0], src, self._rank, "send/recv"))
        return _done(tensors)

    def recv_anysource(self, tensors, tag: int = 0):
        raise NotImplementedError("recv without src= is not supported on the tpu backend: an XLA collective is "
                                  "compiled for fixed source and destination devices; pass src=")
