"""JAX (and Pallas) functions as PyTorch ops on the tpu device: :func:`jax_op` and :func:`call_jax`.

``jax_op("mylib::gelu2", fn)`` makes a ``torch.library.custom_op`` whose schema comes from ``fn``'s annotations
(``jax.Array`` -> ``Tensor``, ``list[jax.Array]`` -> ``Tensor[]``, ``int/float/bool/str`` -> static values), and
whose fake (meta) implementation is ``jax.eval_shape(fn)``. On the tpu device the op is registered in the same
op table as ATen lowerings (:data:`torchtpu_lab.ops.LOWERINGS`), with static scalars, so everything that runs
lowerings runs it: strict mode jits it per signature, fused mode records it into the lazy graph (it is no sync
point), ``torch.compile(backend="tpu")`` inlines it into the compiled JAX function, and ``FakeTensorMode``
gets shapes from the fake implementation. On CPU tensors it runs ``fn`` with JAX on the host, so the op is
usable (and ``torch.library.opcheck``-able) anywhere.

Gradients: ``op.register_autograd(backward, setup_context=...)`` as for any custom op, or ``autograd="vjp"``,
which derives the backward from ``jax.vjp(fn)`` as a second JAX op (``<name>_vjp``), so the backward also
runs fused and compiled.

An exception raised inside ``fn`` is re-raised naming the op and the user line that called it.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import typing
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .. import caches, dtypes, platform, telemetry
from ..backend import dispatch
from ..ops import LOWERINGS
from ..ops.registry import Lowering
from ..runtime import signatures

_NAMESPACE = "jax_ops"
_STATIC_TYPES = (int, float, bool, str)
_counter = itertools.count()


def _is_array_type(ann) -> bool:
    return ann is jax.Array or ann is jnp.ndarray or ann is torch.Tensor


def _torch_type(ann, where: str):
    """The torch annotation for a JAX one (``jax.Array`` -> ``torch.Tensor`` ...)."""
    if _is_array_type(ann):
        return torch.Tensor
    if ann in _STATIC_TYPES:
        return ann
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin in (list, Sequence, typing.Sequence) and len(args) == 1 and _is_array_type(args[0]):
        return list[torch.Tensor]
    if origin is typing.Union and len(args) == 2 and type(None) in args:
        inner = next(a for a in args if a is not type(None))
        return typing.Optional[_torch_type(inner, where)]
    raise TypeError(
        f"jax_op: {where} is annotated {ann!r}; use jax.Array (a tensor), list[jax.Array], or int, float, bool, "
        "str (static values)"
    )


def _return_type(ann, where: str):
    if ann is inspect.Signature.empty or ann is None:
        return torch.Tensor
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            raise TypeError(f"jax_op: {where} must name each output (tuple[jax.Array, jax.Array]), not use '...'")
        return tuple[tuple(_torch_type(a, where) for a in args)]
    return _torch_type(ann, where)


def _signature(fn: Callable, where: str) -> inspect.Signature:
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 — unresolvable string annotations: use them as written
        hints = {}
    params = []
    for p in sig.parameters.values():
        ann = hints.get(p.name, p.annotation)
        if ann is inspect.Parameter.empty:
            raise TypeError(f"jax_op: parameter {p.name!r} of {where} needs an annotation (jax.Array for a tensor, "
                            "int/float/bool/str for a static value)")
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"jax_op: {where} may not take *args/**kwargs (an op has a fixed schema)")
        params.append(p.replace(annotation=_torch_type(ann, f"parameter {p.name!r} of {where}")))
    return sig.replace(parameters=params,
                       return_annotation=_return_type(hints.get("return", sig.return_annotation), f"the return of {where}"))


def _qualified(name: str) -> str:
    if "::" in name:
        return name
    return f"{_NAMESPACE}::{name}"


class _UserError(RuntimeError):
    """An exception inside the user's JAX function, re-raised naming the op and the calling line."""


def _pallas_context(on_host: bool):
    """Pallas kernels written for a TPU must still run where no TPU compiles them. XLA:CPU can only interpret
    a ``pallas_call``, so off-TPU on CPU (the tpu device on XLA:CPU, or the host implementation) every kernel
    traced inside ``fn`` runs in Pallas's TPU interpret mode, which simulates TPU memory and DMAs; code written
    for TorchTPU then runs unchanged, without ``interpret=True``. On GPU, ``pallas_call`` lowers as written."""
    target = "cpu" if on_host else platform.info().platform
    if target != "cpu":
        return contextlib.nullcontext()
    try:
        from jax.experimental.pallas import tpu as pltpu
    except ImportError:  # a JAX without Pallas: fn cannot contain a pallas_call either
        return contextlib.nullcontext()
    return pltpu.force_tpu_interpret_mode()


def _guarded(fn: Callable, label: str, on_host: bool = False) -> Callable:
    def call(*args, **kwargs):
        try:
            with _pallas_context(on_host):
                return fn(*args, **kwargs)
        except _UserError:
            raise
        except Exception as e:  # noqa: BLE001 — re-raised with the op and the user's line
            where = telemetry.describe(telemetry.user_source(2))
            raise _UserError(f"{label} (a JAX function, {getattr(fn, '__qualname__', fn)}) failed, called at "
                             f"{where}: {type(e).__name__}: {e}") from e

    return call


def _shape_struct(v):
    if isinstance(v, torch.Tensor):
        return jax.ShapeDtypeStruct(tuple(v.shape), dtypes.to_jax(v.dtype))
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, torch.Tensor) for x in v):
        return [_shape_struct(x) for x in v]
    return v


def _first_tensor(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            return a
        if isinstance(a, (list, tuple)):
            t = _first_tensor(a)
            if t is not None:
                return t
    return None


def _abstract_outputs(call, args, kwargs):
    """``jax.eval_shape`` of the call: tensors become ShapeDtypeStructs (traced), everything else is static."""
    flat_args, flat_kwargs = [_shape_struct(a) for a in args], {k: _shape_struct(v) for k, v in kwargs.items()}
    tensor_like = lambda v: isinstance(v, (jax.ShapeDtypeStruct, list))  # noqa: E731
    dyn_pos = [i for i, a in enumerate(flat_args) if tensor_like(a)]
    dyn_kw = [k for k, v in flat_kwargs.items() if tensor_like(v)]

    def traced(*dyn):
        a = list(flat_args)
        for i, v in zip(dyn_pos, dyn[: len(dyn_pos)]):
            a[i] = v
        k = dict(flat_kwargs)
        for name, v in zip(dyn_kw, dyn[len(dyn_pos):]):
            k[name] = v
        return call(*a, **k)

    return jax.eval_shape(traced, *[flat_args[i] for i in dyn_pos], *[flat_kwargs[k] for k in dyn_kw])


def _empty_like_struct(struct, like: torch.Tensor):
    if isinstance(struct, (tuple, list)):
        out = [_empty_like_struct(s, like) for s in struct]
        return tuple(out) if isinstance(struct, tuple) else out
    return like.new_empty(tuple(struct.shape), dtype=dtypes.to_torch(struct.dtype))


def _host_call(call, args, kwargs):
    """Run the JAX function on CPU tensors (host JAX), returning CPU tensors."""
    conv = lambda v: (jnp.asarray(dtypes.host_array(v.detach())) if isinstance(v, torch.Tensor)  # noqa: E731
                      else [conv(x) for x in v] if isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor)
                      else v)
    with jax.default_device(jax.devices("cpu")[0]):
        out = call(*[conv(a) for a in args], **{k: conv(v) for k, v in kwargs.items()})
    return _to_torch(out)


def _to_torch(out):
    if isinstance(out, (tuple, list)):
        res = [_to_torch(o) for o in out]
        return tuple(res) if isinstance(out, tuple) else res
    return dtypes.host_tensor(np.asarray(jax.device_get(out)), dtypes.to_torch(out.dtype))


def jax_op(name: str, fn: Callable | None = None, /, *, donate_argnums: Sequence[int] | int | None = None,
           mutates_args: Sequence[str] = (), autograd: str | None = None):
    """Make the JAX function ``fn`` a PyTorch op named ``name`` (``"ns::op"``; a bare name goes to the
    ``jax_ops`` namespace) that runs on tpu tensors in every eager mode, under ``torch.compile(backend="tpu")``
    and under ``FakeTensorMode``. Usable as a decorator: ``@jax_op("mylib::op")``.

    ``mutates_args``: names of tensor arguments the op overwrites; ``fn`` (being pure) returns their new values
    after its outputs, in the order named. ``donate_argnums``: positions of tensor arguments whose buffers the
    op may reuse — checked here; a mutated argument's old buffer is what gets reused. ``autograd="vjp"``:
    gradients from ``jax.vjp(fn)``. Returns the ``torch.library`` custom op (call it like a function; it has
    ``register_autograd``)."""
    if fn is None:
        return lambda f: jax_op(name, f, donate_argnums=donate_argnums, mutates_args=mutates_args, autograd=autograd)
    if autograd not in (None, "vjp"):
        raise ValueError(f"jax_op: autograd must be None or 'vjp', got {autograd!r}")
    qualified = _qualified(name)
    where = f"{getattr(fn, '__qualname__', fn)} (jax_op {qualified!r})"
    sig = _signature(fn, where)
    names = list(sig.parameters)
    mutates_args = tuple(mutates_args)
    for m in mutates_args:
        if m not in names or sig.parameters[m].annotation is not torch.Tensor:
            raise ValueError(f"jax_op {qualified!r}: mutates_args names {m!r}, which is not a tensor parameter of fn")
    donate = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums or ())
    for i in donate:
        if not (0 <= i < len(names)) or sig.parameters[names[i]].annotation is not torch.Tensor:
            raise ValueError(f"jax_op {qualified!r}: donate_argnums {i} is not a tensor parameter of fn")

    label = qualified
    call = _guarded(fn, label)
    host_call = _guarded(fn, label, on_host=True)
    n_mut = len(mutates_args)
    n_results = 0
    if n_mut:
        # fn returns its outputs and then the mutated arguments' new values; the op returns the outputs only
        fn_ann = sig.return_annotation
        kinds = list(typing.get_args(fn_ann)) if typing.get_origin(fn_ann) is tuple else [fn_ann]
        n_results = len(kinds)
        if n_results < n_mut:
            raise TypeError(f"jax_op {qualified!r}: fn must return its outputs followed by the new values of "
                            f"{list(mutates_args)} (annotate e.g. -> tuple[jax.Array, ...])")
        outs = kinds[: n_results - n_mut]
        sig = sig.replace(return_annotation=None if not outs else outs[0] if len(outs) == 1 else tuple[tuple(outs)])

    def prototype(*args, **kwargs):  # the custom op's default (CPU and other devices) implementation
        out = _host_call(host_call, args, kwargs)
        return _apply_mutations(out, args, kwargs)

    def _apply_mutations(out, args, kwargs):
        if not n_mut:
            return out
        res = list(out) if isinstance(out, (tuple, list)) else [out]
        new_values, outputs = res[len(res) - n_mut:], res[: len(res) - n_mut]
        bound = sig.bind(*args, **kwargs)
        with torch.no_grad():
            for arg_name, value in zip(mutates_args, new_values):
                bound.arguments[arg_name].copy_(value.to(bound.arguments[arg_name].device))
        if not outputs:
            return None
        return outputs[0] if len(outputs) == 1 and typing.get_origin(sig.return_annotation) is not tuple else tuple(outputs)

    prototype.__signature__ = sig
    prototype.__name__ = qualified.split("::")[1]
    op_def = torch.library.custom_op(qualified, mutates_args=mutates_args)(prototype)
    overload = op_def._opoverload
    signatures.USER_DEFINED_OPS.add(overload)  # never keyed on disk by its name alone

    def fake(*args, **kwargs):
        like = _first_tensor(list(args) + list(kwargs.values()))
        struct = _abstract_outputs(call, args, kwargs)
        if n_mut:
            struct = struct[: len(struct) - n_mut] if isinstance(struct, (tuple, list)) else ()
            if not struct:
                return None
            struct = struct[0] if len(struct) == 1 and typing.get_origin(sig.return_annotation) is not tuple else tuple(struct)
        if like is None:
            raise RuntimeError(f"{label}: an op made with jax_op needs at least one tensor argument")
        return _empty_like_struct(struct, like)

    op_def.register_fake(fake)

    if n_mut:
        # The pure form, another op (outputs..., new values of the mutated arguments), runs like any jax_op; the
        # tpu kernel of the mutating op calls it and writes the new values into the arguments.
        functional_op = jax_op(qualified + "_functional", _functional_form(fn, sig, n_results))

        def tpu_kernel(*args, **kwargs):
            from ..runtime import values

            bound = sig.bind(*args, **kwargs)
            res = functional_op(*bound.args, **bound.kwargs)
            res = list(res) if isinstance(res, (tuple, list)) else [res]
            out = res[: len(res) - n_mut]
            for arg_name, value in zip(mutates_args, res[len(res) - n_mut:]):
                values.assign(bound.arguments[arg_name], value)
            if not out:
                return None
            return out[0] if len(out) == 1 and typing.get_origin(sig.return_annotation) is not tuple else tuple(out)

        op_def.register_kernel("tpu")(dispatch.tpu_kernel(tpu_kernel))
    else:
        low = Lowering(overload, call, static_scalars=True)
        LOWERINGS[overload] = low
        op_def.register_kernel("tpu")(dispatch.tpu_kernel(low))

    if autograd == "vjp":
        _register_vjp(op_def, fn, qualified, sig, names)
    return op_def


def _functional_form(fn: Callable, sig: inspect.Signature, n_results: int) -> Callable:
    """``fn`` with a return annotation naming every result (its outputs, then the mutated arguments' values)."""
    results = [jax.Array] * n_results

    def functional(*args, **kwargs):
        res = fn(*args, **kwargs)
        if len(results) == 1:  # a one-element tuple return is a single tensor in a schema
            return res[0] if isinstance(res, (tuple, list)) else res
        return tuple(res) if isinstance(res, (tuple, list)) else (res,)

    params = [p.replace(annotation=jax.Array if p.annotation is torch.Tensor else
                        list[jax.Array] if p.annotation == list[torch.Tensor] else p.annotation)
              for p in sig.parameters.values()]
    functional.__signature__ = inspect.Signature(
        params, return_annotation=jax.Array if len(results) == 1 else tuple[tuple(results)])
    functional.__qualname__ = getattr(fn, "__qualname__", "fn")
    return functional


def _register_vjp(op_def, fn: Callable, qualified: str, sig: inspect.Signature, names: list[str]) -> None:
    """``autograd="vjp"``: the backward is another JAX op computing ``jax.vjp(fn)``'s pullback."""
    tensor_names = [n for n in names if sig.parameters[n].annotation is torch.Tensor]
    static_names = [n for n in names if n not in tensor_names]
    if any(sig.parameters[n].annotation not in (torch.Tensor,) + _STATIC_TYPES for n in names):
        raise TypeError(f"jax_op {qualified!r}: autograd='vjp' supports tensor and static parameters only")

    def pullback(primals, cotangents, statics):
        def f(*tensors):
            bound = dict(zip(tensor_names, tensors))
            bound.update(zip(static_names, statics))
            return fn(**bound)

        out, pull = jax.vjp(f, *primals)
        cts = tuple(cotangents) if isinstance(out, (tuple, list)) else cotangents[0]
        grads = pull(cts)
        return [g if g.dtype != jax.dtypes.float0 else jnp.zeros(p.shape, p.dtype) for g, p in zip(grads, primals)]

    params = [inspect.Parameter("primals", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=list[jax.Array]),
              inspect.Parameter("cotangents", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=list[jax.Array])]
    params += [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=sig.parameters[n].annotation)
               for n in static_names]

    def vjp_fn(primals, cotangents, *statics):
        return pullback(primals, cotangents, statics)

    vjp_fn.__signature__ = inspect.Signature(params, return_annotation=list[jax.Array])
    vjp_fn.__qualname__ = f"vjp of {getattr(fn, '__qualname__', fn)}"
    backward_op = jax_op(qualified + "_vjp", vjp_fn)

    def setup_context(ctx, inputs, output):
        bound = dict(zip(names, inputs))
        ctx.tensors_in = [bound[n] for n in tensor_names]
        ctx.statics = [bound[n] for n in static_names]
        outs = output if isinstance(output, (tuple, list)) else (output,)
        ctx.out_meta = [(tuple(o.shape), o.dtype, o.device) for o in outs]
        ctx.save_for_backward(*ctx.tensors_in)

    def backward(ctx, *grads):
        primals = list(ctx.saved_tensors)
        cts = [g if g is not None else torch.zeros(s, dtype=d, device=dev)
               for g, (s, d, dev) in zip(grads, ctx.out_meta)]
        tensor_grads = iter(backward_op(primals, cts, *ctx.statics))
        return tuple(next(tensor_grads) if n in tensor_names else None for n in names)

    op_def.register_autograd(backward, setup_context=setup_context)


_CALL_JAX = caches.cache("call_jax_ops", 256, code=True)


def call_jax(fn: Callable, *tensors: torch.Tensor):
    """Run the JAX function ``fn`` on ``tensors`` once, as an op (no annotations needed: every argument is a
    tensor; the output structure is read from ``jax.eval_shape``). Ops are cached per function and structure."""
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError("call_jax(fn, *tensors): every argument after fn must be a tensor; "
                        "use jax_op for static arguments")
    structs = [jax.ShapeDtypeStruct(tuple(t.shape), dtypes.to_jax(t.dtype)) for t in tensors]
    out = jax.eval_shape(_guarded(fn, f"call_jax({getattr(fn, '__qualname__', fn)})"), *structs)
    n_out = len(out) if isinstance(out, (tuple, list)) else None
    key = (fn, len(tensors), n_out)
    op_def = _CALL_JAX.get(key)
    if op_def is None:
        params = [inspect.Parameter(f"x{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=jax.Array)
                  for i in range(len(tensors))]
        ret = jax.Array if n_out is None else tuple[tuple([jax.Array] * n_out)]

        def wrapper(*args):
            result = fn(*args)
            return tuple(result) if n_out is not None else result

        wrapper.__signature__ = inspect.Signature(params, return_annotation=ret)
        wrapper.__qualname__ = getattr(fn, "__qualname__", "fn")
        base = "".join(c if c.isalnum() else "_" for c in getattr(fn, "__name__", "fn"))
        op_def = jax_op(f"{_NAMESPACE}::call_jax_{base}_{next(_counter)}", wrapper)
        _CALL_JAX.put(key, op_def)
    return op_def(*tensors)


def op_of(op_def) -> torch._ops.OpOverload:
    """The ``OpOverload`` of a jax_op (what appears in graphs and profiles)."""
    return op_def._opoverload


__all__ = ["jax_op", "call_jax", "op_of"]
