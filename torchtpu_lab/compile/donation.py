"""Which inputs of a compiled graph are donated to its program, so a step does not hold the model twice.

A compiled ``optimizer.step()`` (or a whole training step) returns every parameter and state tensor it updates
as a new array, written back into the input tensors after the call (:mod:`.backend`). Without donation the
program's inputs (the old values) and outputs (the new ones) are both on the device while it runs: the model
and its optimizer state twice. Donated, XLA writes each new value into the old value's buffer.

An input is donated when the graph replaces it (an input mutation) and nothing else can read its old buffer:

* it is a real tpu base tensor (a view's value is gathered into a fresh array first: nothing to reuse) whose
  storage holds exactly the array passed, and no other live storage holds that array
  (:func:`torchtpu_lab.device.memory.holders`);
* the array is passed once (an input read twice would be read after it was overwritten);
* no fused work is pending: a recorded graph may read the old buffer as one of its leaves, and it runs later.
  Such a call runs its executable without donation (a second executable of the same graph, compiled once).

JAX pairs each output, in order, with the first donated input of the same shape and dtype not paired yet; the
graph returns its outputs first and the mutated inputs after, so a gradient (shaped like its parameter) would
be paired with the parameter's buffer, which the update still reads, and XLA would copy every donated parameter
on entry. So the donating executable returns the new values of the donated inputs first, in input order (each
pairs with its own old buffer), and :func:`restore` puts the outputs back in the graph's order.
"""

from __future__ import annotations

from collections import Counter

import jax
import torch

from ..device import memory, tensor
from ..runtime import fused


def donatable(args: list, arrays: list, mutations: list) -> tuple[int, ...]:
    """Positions (ascending) of the graph inputs whose buffers the program may reuse; ``mutations``: the plan's
    ``(input index, output position)`` pairs."""
    if not mutations or fused.has_pending():
        return ()
    passed = Counter(id(a) for a in arrays if isinstance(a, jax.Array))
    donate = []
    for index, _ in mutations:
        t, array = args[index], arrays[index]
        if not (isinstance(t, torch.Tensor) and t.device.type == "tpu" and isinstance(array, jax.Array)):
            continue
        t = tensor.adopt(t)
        storage = t.tpu_storage
        if (t.tpu_view is None and storage.held is array and passed[id(array)] == 1
                and memory.holders(array) == 1):
            donate.append(index)
    return tuple(sorted(donate))


def output_order(n_outputs: int, mutations: list, donate: tuple) -> tuple[int, ...]:
    """The order the donating program returns the graph's ``n_outputs`` arrays in: the donated inputs' new
    values first (in input order), then the rest as the graph returns them."""
    position = dict(mutations)
    first = [position[i] for i in donate]
    taken = set(first)
    return tuple(first + [j for j in range(n_outputs) if j not in taken])


def reordered(fn, order: tuple[int, ...]):
    """``fn`` returning its outputs in ``order``."""

    def donating(*arrays):
        outs = fn(*arrays)
        return tuple(outs[j] for j in order)

    return donating


def restore(outs, order: tuple[int, ...]) -> list:
    """The outputs of a :func:`reordered` function back in the graph's order."""
    result = [None] * len(order)
    for k, j in enumerate(order):
        result[j] = outs[k]
    return result
