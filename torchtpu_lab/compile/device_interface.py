"""Dynamo's device interface for ``tpu``: what ``torch._dynamo.device_interface.get_interface_for_device("tpu")``
answers (device count, current device, streams, synchronize, dtypes, properties).

PyTorch ships a ``TpuInterface`` for torch_xla under the same name: it reports no devices, device 0 always, and
no float64 or float16, and raises for ``device_count``, ``synchronize`` and ``current_stream``. Code that asks the
interface of a tensor's device (Dynamo's handling of stream and event calls, ``torch._inductor`` utilities,
OpenReg-style backend tests) then fails on a tpu tensor. :func:`install` registers this one for ``tpu`` and each
``tpu:i`` once Dynamo is imported (after PyTorch's own registrations, which run lazily once).
"""

from __future__ import annotations

from collections import namedtuple

import torch

_installed: list[bool] = []


def _interface():
    from torch._dynamo.device_interface import DeviceInterface

    class TpuLabInterface(DeviceInterface):
        """The ``tpu`` device of torchtpu_lab (JAX/XLA), through ``torch.tpu``."""

        Event = torch.Event
        Stream = torch.Stream

        class device:
            def __new__(cls, device):
                return torch.tpu.device(device)

        class Worker:
            @staticmethod
            def set_device(device: int) -> None:
                torch.tpu.set_device(device)

            @staticmethod
            def current_device() -> int:
                return torch.tpu.current_device()

            @staticmethod
            def get_device_properties(device=None):
                props = torch.tpu.get_device_properties(device)
                return namedtuple("TPUProperties", ["name", "multi_processor_count", "total_memory"])(
                    props.name, 1, props.total_memory)

        @staticmethod
        def current_device() -> int:
            return torch.tpu.current_device()

        @staticmethod
        def set_device(device) -> None:
            torch.tpu.set_device(device)

        @staticmethod
        def exchange_device(device: int) -> int:
            previous = torch.tpu.current_device()
            if device >= 0:
                torch.tpu.set_device(device)
            return previous

        maybe_exchange_device = exchange_device

        @staticmethod
        def device_count() -> int:
            return torch.tpu.device_count()

        @staticmethod
        def is_available() -> bool:
            return torch.tpu.is_available()

        @staticmethod
        def stream(stream):
            return torch.tpu.stream(stream)

        @staticmethod
        def current_stream():
            return torch.accelerator.current_stream(torch.tpu.current_device())

        @staticmethod
        def set_stream(stream) -> None:
            torch.accelerator.set_stream(stream)

        @staticmethod
        def synchronize(device=None) -> None:
            torch.tpu.synchronize(device)

        @staticmethod
        def get_compute_capability(device=None) -> str:
            return ""

        @staticmethod
        def is_bf16_supported(including_emulation: bool = False) -> bool:
            return True

        @classmethod
        def is_dtype_supported(cls, dtype: torch.dtype, including_emulation: bool = False) -> bool:
            from .. import dtypes

            try:
                dtypes.to_jax(dtype)
            except dtypes.UnsupportedDtype:
                return False
            return True

    return TpuLabInterface


def install() -> None:
    """Register the interface for ``tpu`` now and for ``tpu:0`` ... once the platform is decided (importing Dynamo
    must not start JAX's backends); idempotent, Dynamo must be imported."""
    if _installed:
        return
    from torch._dynamo import device_interface

    from .. import platform

    device_interface.get_registered_device_interfaces()  # PyTorch's own registrations first (they run once)
    interface = _interface()
    device_interface.register_interface_for_device("tpu", interface)

    def each_device(info) -> None:
        for i in range(len(info.devices)):
            device_interface.register_interface_for_device(f"tpu:{i}", interface)

    platform.when_known(each_device)
    _installed.append(True)


def installed() -> bool:
    return bool(_installed)
