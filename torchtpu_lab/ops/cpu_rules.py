"""What PyTorch's CPU kernel says of a call's dtypes, asked of the kernel itself on one-element stand-ins.

Some of PyTorch's rules live only in its CPU kernels, op by op: which ``out=`` dtypes an op casts into
(TensorIterator's per-op policy: ``neg`` wants its out exact, ``add`` casts safely, ``nonzero`` wants Long) and
which ops refuse complex numbers (``floor``, ``maximum``, ``round``: JAX computes something for them, a silent
wrong value). Rather than copy those tables, the kernel is run once per combination of dtypes on stand-ins:
every tensor replaced by a one-element CPU tensor of its dtype and rank. The answer is cached. Only an error
that :func:`refusal`'s caller accepts as being about types is taken: a stand-in's sizes may trip a check about
sizes that the real call passes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .registry import NoKernel

#: (op, what the call's arguments are) -> (type, args) of the CPU kernel's exception for stand-ins, or None
_VERDICTS: dict = {}
_VERDICTS_MAX = 4096


def _kind(v, values: bool = False):
    """What the answer for ``v`` depends on: a tensor's dtype and rank; another value's type, or (``values``)
    the value itself (a ``dim`` or ``reduce`` argument some checks read)."""
    if isinstance(v, torch.Tensor):
        return v.dtype, v.dim()
    if isinstance(v, (list, tuple)):
        return tuple(_kind(x, values) for x in v)
    if isinstance(v, dict):
        return tuple((k, _kind(x, values)) for k, x in v.items())
    return (type(v), v) if values and isinstance(v, (bool, int, float, str, type(None))) else type(v)


def _stand_in(v):
    if isinstance(v, torch.Tensor):
        return torch.zeros((1,) * v.dim(), dtype=v.dtype)
    if isinstance(v, (list, tuple)):
        return type(v)(_stand_in(x) for x in v)
    return v


def raise_refusal(op, args, kwargs: dict, about: Callable[[BaseException], bool], values: bool = False) -> None:
    """Raise what :func:`refusal` finds, if anything; CPU's NotImplementedError as :class:`~.registry.NoKernel`
    (PyTorch's own error for the caller, not "run it on the CPU")."""
    refused = refusal(op, args, kwargs, about, values=values)
    if isinstance(refused, NotImplementedError):
        raise NoKernel(str(refused))
    if refused is not None:
        raise refused


def refusal(op, args, kwargs: dict, about_types: Callable[[BaseException], bool],
            empty: tuple[str, ...] = (), values: bool = False) -> BaseException | None:
    """The exception ``op``'s CPU kernel raises for arguments of these dtypes (and Python types), or None.

    ``about_types`` says whether an exception is about the dtypes (others are the stand-ins' doing and ignored);
    ``empty`` names keyword arguments (``out=``) passed as empty tensors of their dtype, for the kernel to resize;
    ``values``: the answer depends on the Python numbers and strings passed too, not only on their types."""
    key = (op, about_types, empty, _kind(args, values), _kind(kwargs, values))
    return verdict(key, lambda: op(*_stand_in(args), **{k: torch.empty(0, dtype=v.dtype) if k in empty
                                                        else _stand_in(v) for k, v in kwargs.items()}), about_types)


def verdict(key, call: Callable[[], object], about: Callable[[BaseException], bool]) -> BaseException | None:
    """The exception ``call()`` (a CPU kernel on stand-ins) raises, if ``about`` accepts it, else None: asked once
    per ``key`` (hashable; it names what the answer depends on), without gradients, keeping the user's CPU
    random stream (a random op draws from it)."""
    if key not in _VERDICTS:
        if len(_VERDICTS) >= _VERDICTS_MAX:
            _VERDICTS.clear()
        _VERDICTS[key] = _ask(call, about)
    answer = _VERDICTS[key]
    return None if answer is None else answer[0](*answer[1])  # a fresh exception: each raise has its traceback


def _ask(call, about) -> tuple | None:
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            call()
    except Exception as e:  # noqa: BLE001 — any exception is an answer; the caller says which ones count
        return (type(e), e.args) if about(e) else None
    return None


def _about_complex(e: BaseException) -> bool:
    return isinstance(e, (RuntimeError, NotImplementedError)) and "omplex" in str(e)


def _has_complex(v) -> bool:
    if isinstance(v, torch.Tensor):
        return v.is_complex()
    return isinstance(v, (list, tuple)) and any(_has_complex(x) for x in v)


def check_complex(op, args, kwargs: dict) -> None:
    """Raise what CPU raises for ``op`` on complex tensors (``floor``, ``maximum``, ``round``, ``sign`` refuse
    them), if any argument is one."""
    if _has_complex(args) or _has_complex(tuple(kwargs.values())):
        raise_refusal(op, args, kwargs, _about_complex)
