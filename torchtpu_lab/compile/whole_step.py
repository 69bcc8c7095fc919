"""``fullgraph=True`` around a whole training step (forward, ``loss.backward()``, ``opt.step()``) whose optimizer
holds tpu parameters.

Why it failed. Not because of tpu tensors: the same step on the CPU fails the same way, at two places of
PyTorch's own code that assume the optimizer step is a graph of its own.

* ``Optimizer.step`` is wrapped by ``torch.optim.optimizer._use_grad_for_differentiable``, whose ``_use_grad``
  calls ``torch._dynamo.graph_break()`` before and after the step, so that AOTAutograd sees the step alone,
  under ``no_grad``, as an inference graph (PyTorch's comment there: "or have a fully fused forward and backward
  graph, which will have no_grad by default, and we can remove this graph break"). In one graph traced with
  ``fullgraph=True`` the break is an error ("Call to torch._dynamo.graph_break()"), and not needed: Dynamo traces
  the ``set_grad_enabled(False)`` around the step as a graph op like any other.
* Dynamo runs the optimizer's ``_init_group`` (which picks the parameters that have a ``.grad`` and creates
  their state) in Python, on the real tensors, and refuses when a parameter has a pending attribute mutation
  ("optimizer: pending mutation on parameter"): a ``.grad`` set by ``loss.backward()`` earlier in the same graph
  is not on the real parameter yet, so ``_init_group`` would not see it.

What. Narrow wrappers around Dynamo, active only while Dynamo traces with ``fullgraph=True`` (or under
``torch._dynamo.error_on_graph_break(True)``) an optimizer whose parameters are all tpu tensors; every other
trace (CPU and CUDA optimizers, steps with graph breaks allowed) runs Dynamo's code unchanged:

* ``torch._dynamo.graph_break()`` called from ``_use_grad`` is a no-op;
* ``torch.optim``'s ``_fused_adam``/``_fused_adamw``/``_fused_sgd`` (the ``fused=True`` step functions, which
  Dynamo wraps in ``torch.compiler.disable`` with the reason "don't trace into fused optimizer", so that a
  ``fused=True`` step would break the graph there) are traced through: their one ``_fused_*_`` op joins the
  graph, and the backend has it call our torch-level kernel (:mod:`.fused_optimizers`);
* ``_init_group`` runs with a stand-in ``.grad`` (an uninitialised tensor like the parameter) on each parameter
  whose ``.grad`` the traced backward set, so it selects and initialises the same parameters as the eager step
  would; where it hands a stand-in to the traced step, the traced gradient (the pending value) is used instead.
  The real ``.grad`` attributes are restored at once; Dynamo writes the traced ones back after the call.

The backward itself is traced by Dynamo with ``torch._dynamo.config.trace_autograd_ops = True`` (PyTorch's
option; with ``fullgraph=True`` there is no graph break in the forward, the case where torch 2.13 drops the
backward). The whole step is then one Dynamo graph, lowered as one program (:mod:`.backend`). Listed in
:func:`torchtpu_lab.global_changes`.
"""

from __future__ import annotations

import contextlib
import inspect

import torch

_MARK = "__torchtpu_lab_original__"
#: the reason ``torch._dynamo`` gives when it wraps ``torch.optim``'s ``_fused_adam``/``_fused_sgd``... in
#: ``torch.compiler.disable`` (``torch/_dynamo/eval_frame.py``)
_FUSED_DISABLE_REASON = "don't trace into fused optimizer"


def _use_grad_code():
    """The code object every ``_use_grad`` wrapper of ``torch.optim`` shares."""
    from torch.optim.optimizer import _use_grad_for_differentiable

    return _use_grad_for_differentiable(lambda self: None).__code__


def _one_graph(tx) -> bool:
    return bool(getattr(tx, "one_graph", False) or getattr(tx, "error_on_graph_break", False))


def _on_tpu(optimizer) -> bool:
    params = [p for g in getattr(optimizer, "param_groups", ()) for p in g["params"]]
    return bool(params) and all(isinstance(p, torch.Tensor) and p.device.type == "tpu" for p in params)


def _optimizer_of(tx):
    """The optimizer whose ``_use_grad`` frame ``tx`` traces (its ``self``), or ``None``."""
    from torch._dynamo.variables.optimizer import OptimizerVariable

    var = tx.symbolic_locals.get("self")
    return var.value if isinstance(var, OptimizerVariable) else None


def _stepping_optimizer(tx, code):
    """The optimizer whose step ``tx`` (or a frame it was inlined from) traces, or ``None``."""
    while tx is not None:
        if getattr(tx, "f_code", None) is code:
            return _optimizer_of(tx)
        tx = getattr(tx, "parent", None)
    return None


def _fused_step_function(value):
    """The function under a ``torch.compiler.disable`` that Dynamo put around ``torch.optim``'s ``_fused_*``
    step functions, or ``None`` for any other function."""
    if inspect.getattr_static(value, "_torchdynamo_disable_msg", None) != _FUSED_DISABLE_REASON:
        return None
    return getattr(value, "_torchdynamo_orig_callable", None)


def _wrap_graph_break(skip_function_variable, code) -> None:
    original = skip_function_variable.call_function

    def call_function(self, tx, args, kwargs):
        if self.value is torch._dynamo.graph_break:
            if getattr(tx, "f_code", None) is code and _one_graph(tx) and _on_tpu(_optimizer_of(tx)):
                from torch._dynamo.variables.constant import ConstantVariable

                return ConstantVariable.create(None)
        else:
            fused_step = _fused_step_function(self.value)
            if fused_step is not None and _one_graph(tx) and _on_tpu(_stepping_optimizer(tx, code)):
                from torch._dynamo.variables.functions import UserFunctionVariable

                return UserFunctionVariable(fused_step).call_function(tx, args, kwargs)
        return original(self, tx, args, kwargs)

    setattr(call_function, _MARK, original)
    skip_function_variable.call_function = call_function


def _pending_grads(var, tx) -> dict:
    """Each parameter whose ``.grad`` the traced code has set, with the value it set (a variable tracker)."""
    side_effects = tx.output.side_effects
    pending = {}
    for group in var.value.param_groups:
        for p in group["params"]:
            p_var = side_effects.id_to_variable.get(id(p))
            if p_var is not None and side_effects.has_pending_mutation_of_attr(p_var, "grad"):
                pending[p] = side_effects.load_attr(p_var, "grad")
    return pending


@contextlib.contextmanager
def _stand_in_grads(var, pending: dict):
    """The real parameters carry stand-in ``.grad`` tensors (``None`` where the traced value is ``None``) while
    ``_init_group`` runs; ``var.stand_ins`` maps each stand-in to the traced gradient."""
    from torch._dynamo.variables.tensor import TensorVariable

    saved = {p: p.grad for p in pending}
    var.stand_ins = {}
    try:
        with torch.no_grad():
            for p, traced in pending.items():
                stand_in = torch.empty_like(p) if isinstance(traced, TensorVariable) else None
                p.grad = stand_in
                if stand_in is not None:
                    var.stand_ins[stand_in] = traced
        yield
    finally:
        var.stand_ins = {}
        for p, grad in saved.items():
            p.grad = grad


def _wrap_init_group(optimizer_variable) -> None:
    call_method = optimizer_variable.call_method
    wrap_tensor = optimizer_variable.wrap_tensor
    check = optimizer_variable.graph_break_if_pending_mutation

    def traced_call_method(self, tx, name, args, kwargs):
        if name != "_init_group" or not _one_graph(tx) or not _on_tpu(self.value):
            return call_method(self, tx, name, args, kwargs)
        pending = _pending_grads(self, tx)
        if not pending:
            return call_method(self, tx, name, args, kwargs)
        with _stand_in_grads(self, pending):
            self.grads_are_traced = True
            try:
                return call_method(self, tx, name, args, kwargs)
            finally:
                self.grads_are_traced = False

    def traced_wrap_tensor(self, tx, value):
        traced = getattr(self, "stand_ins", {}).get(value)
        return traced if traced is not None else wrap_tensor(self, tx, value)

    def graph_break_if_pending_mutation(self, tx):
        if not getattr(self, "grads_are_traced", False):  # the pending mutations are the grads, handled above
            check(self, tx)

    for name, fn, original in (("call_method", traced_call_method, call_method),
                               ("wrap_tensor", traced_wrap_tensor, wrap_tensor),
                               ("graph_break_if_pending_mutation", graph_break_if_pending_mutation, check)):
        setattr(fn, _MARK, original)
        setattr(optimizer_variable, name, fn)


def install() -> None:
    """Wrap Dynamo's handling of ``graph_break()``, of the ``torch.compiler.disable`` around the fused step
    functions and of the optimizer's ``_init_group`` (idempotent; Dynamo must be imported)."""
    from torch._dynamo.variables.functions import SkipFunctionVariable
    from torch._dynamo.variables.optimizer import OptimizerVariable

    if not hasattr(SkipFunctionVariable.call_function, _MARK):
        _wrap_graph_break(SkipFunctionVariable, _use_grad_code())
    if not hasattr(OptimizerVariable.call_method, _MARK):
        _wrap_init_group(OptimizerVariable)


def installed() -> bool:
    import sys

    if "torch._dynamo.variables.optimizer" not in sys.modules:
        return False
    from torch._dynamo.variables.functions import SkipFunctionVariable
    from torch._dynamo.variables.optimizer import OptimizerVariable

    return hasattr(SkipFunctionVariable.call_function, _MARK) and hasattr(OptimizerVariable.call_method, _MARK)
