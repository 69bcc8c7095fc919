"""``torch.compile(fn)`` with no ``backend`` on tpu tensors compiles with ``"tpu"``; everything else stays on
Inductor.

``torch.compile``'s default backend is an instance of ``torch._TorchCompileInductorWrapper``, called with each
graph Dynamo captures and its example inputs. Inductor cannot compile a graph whose tensors live on the tpu
device (it fails on its first op), so the wrapper's ``__call__`` is wrapped: a graph that touches a tpu tensor
(an input, or a value made inside it: a factory with ``device="tpu"``) goes to our backend, any other graph to
Inductor exactly as before, with the same arguments. The decision is made per graph, not per process: an
earlier version of this routing replaced the default for everyone and broke CPU and CUDA users.
``backend="inductor"`` named explicitly is the same wrapper, so a tpu graph given to it compiles with ``"tpu"``
too (Inductor would only fail on it).

The choice is recorded (:data:`choices`, the latest decisions, bounded) so a user or a test can see which
backend compiled a graph, and :func:`torchtpu_lab.global_changes` lists the wrapping.
"""

from __future__ import annotations

import collections
import functools

import torch

TPU = "tpu"
INDUCTOR = "inductor"

#: the latest routing decisions, oldest first: (the compiled frame's code name, backend name)
choices: collections.deque = collections.deque(maxlen=64)


def touches_tpu(gm: torch.fx.GraphModule, example_inputs) -> bool:
    """Whether a Dynamo graph reads or makes a tensor on the tpu device."""
    if any(isinstance(x, torch.Tensor) and x.device.type == TPU for x in example_inputs):
        return True
    for node in gm.graph.nodes:
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.Tensor) and value.device.type == TPU:
            return True
    return False


def install() -> None:
    """Wrap the default backend's ``__call__`` (idempotent)."""
    wrapper = torch._TorchCompileInductorWrapper
    original = wrapper.__call__
    if hasattr(original, "__torchtpu_lab_original__"):
        return

    @functools.wraps(original)
    def __call__(self, model_, inputs_, **kwargs):
        if type(self) is wrapper and touches_tpu(model_, inputs_):  # AOTInductor (a subclass) is asked for by name
            choices.append((_name(model_), TPU))
            from .backend import tpu_backend

            return tpu_backend(model_, inputs_)
        choices.append((_name(model_), INDUCTOR))
        return original(self, model_, inputs_, **kwargs)

    __call__.__torchtpu_lab_original__ = original
    wrapper.__call__ = __call__


def installed() -> bool:
    return hasattr(torch._TorchCompileInductorWrapper.__call__, "__torchtpu_lab_original__")


def _name(gm) -> str:
    from .events import frame_name

    return frame_name(gm)
