"""A repeated op call's executable, found from one flat key of its arguments (issue 26: the per-op host path).

The general path (:class:`.encode.Encoder`) builds a template of every argument — a :class:`~.signatures.Slot`
named tuple per tensor, a :class:`~.signatures.Static` per number — and looks the op's executable up by it.
That is a good part of an op's host time, and a repeated call (the same op on tensors of the same shapes,
dtypes and view geometry, with numbers in the same places) needs none of it: :func:`key` walks the arguments
once, building a flat tuple that determines the template (so the executable) and, in the same pass, the
dynamic inputs in the order the encoder would give them. :data:`EXECUTABLES` maps that key to the executable
the general path found the first time.

The key covers only the common shapes of a call: tpu tensors (base or view) on one device, Python numbers,
``None``, lists of ints, dtypes, strings, layouts and memory formats. Anything else — a CPU tensor, a tensor
list, a generator, a random op, tensors on two devices (whose error the encoder raises) — returns ``None``, and
the call takes the general path, so the two paths can never disagree on an executable: a key maps to exactly
one template, because every token says what the encoder would make of its argument (numbers carry their type,
so ``1``, ``1.0`` and ``True`` differ as :class:`Static` does; numbers the encoder makes dynamic carry only
their type).
"""

from __future__ import annotations

import torch

from .. import caches
from ..device import views
from ..device.tensor import TpuTensor

#: fast key -> the op's executable (an :class:`.executor.OpExecutable`); cleared with every other cache
EXECUTABLES = caches.cache("op_fast_keys", 4096, code=True)

_NUMBERS = (bool, int, float, complex)
#: argument types the encoder passes through unchanged (hashable, and never equal to a number)
_PLAIN = frozenset({str, torch.dtype, torch.layout, torch.memory_format})


_NOT_TENSOR = -1
_UNSUPPORTED = -2


def key(op_id: int, positions: frozenset, names: frozenset, dynamic_scalars: bool, args: tuple, kwargs: dict):
    """``(key, dynamic inputs, device index)`` of a call, or ``None`` where only the general path can say.

    ``positions``/``names``: where a number is a value (see :func:`.encode.op_plan`); ``dynamic_scalars``: the
    lowering takes those as graph inputs (not ``static_scalars``)."""
    dyn: list = []
    tokens: list = [op_id]
    device = _NOT_TENSOR
    for i, a in enumerate(args):
        d = _add(a, dynamic_scalars and i in positions, tokens, dyn)
        if d != _NOT_TENSOR:
            if d == _UNSUPPORTED or (device != _NOT_TENSOR and d != device):
                return None  # two devices: the encoder raises PyTorch's error
            device = d
    if kwargs:
        for name, a in kwargs.items():
            tokens.append(name)
            d = _add(a, dynamic_scalars and name in names, tokens, dyn)
            if d != _NOT_TENSOR:
                if d == _UNSUPPORTED or (device != _NOT_TENSOR and d != device):
                    return None
                device = d
    if device == _NOT_TENSOR:  # a factory: its device comes from its arguments (general path)
        return None
    return tuple(tokens), dyn, device


_NONE = ("none",)


def _add(a, dynamic: bool, tokens: list, dyn: list) -> int:
    """Append the key token of one argument to ``tokens`` and its dynamic inputs to ``dyn``, in the encoder's
    order; return a tensor's device index, ``_NOT_TENSOR``, or ``_UNSUPPORTED`` (nothing appended that counts:
    the caller gives up)."""
    tp = type(a)
    if tp is TpuTensor:
        storage = a.tpu_storage
        dyn.append(storage.array)
        view = a.tpu_view
        if view is None:
            tokens.append((storage.shape, storage.dtype))
        else:
            vkey, offset = views.dynamic(storage.shape, view)
            if offset is not None:
                dyn.append(offset)
            tokens.append((storage.shape, storage.dtype, vkey))
        return storage.device_index
    if tp in _NUMBERS:
        if dynamic:
            dyn.append(a)
            tokens.append(tp)
        else:
            tokens.append((tp, a))
        return _NOT_TENSOR
    if a is None:
        tokens.append(_NONE)
        return _NOT_TENSOR
    if tp is list or tp is tuple:
        for x in a:
            if type(x) is not int:
                return _UNSUPPORTED
        tokens.append(("ints", tuple(a)))
        return _NOT_TENSOR
    if tp in _PLAIN:
        tokens.append(a)
        return _NOT_TENSOR
    return _UNSUPPORTED
