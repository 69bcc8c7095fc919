"""Host-to-device copies: a host array's values as a device array on one ``tpu`` device.

``jax.device_put`` costs 35–75 µs of Python per call (argument checks, sharding and layout resolution, the
x64 context) before JAX's own C++ transfer, which takes 3–5 µs for a small array. The runtime copies host data
in every ``torch.tensor(..., device="tpu")``, ``.to("tpu")`` and ``copy_`` from a CPU tensor, and models do so
per step: transformers' ``DynamicLayer`` makes two empty tensors per layer per forward, a decode step moves its
position ids. So :func:`to_device` calls that C++ transfer directly for the common case (one device, a
numpy array whose dtype JAX keeps as it is), with the device's sharding made once, and leaves everything else
— and any JAX whose internals moved — to ``jax.device_put``.
"""

from __future__ import annotations

import jax
import numpy as np

from .. import platform

try:  # JAX's internals: absent or changed in some release, the public path serves
    from jax._src import core as _jax_core
    from jax._src import dtypes as _jax_dtypes
    from jax._src.lib import xla_client as _xc

    _direct = _xc.batched_device_put
    _shaped = _jax_core.ShapedArray
    _canonical = _jax_dtypes.canonicalize_dtype
except (ImportError, AttributeError):  # pragma: no cover - depends on the JAX release
    _direct = None

#: device index -> (jax.Device, its SingleDeviceSharding)
_targets: dict[int, tuple] = {}
#: (shape, dtype) -> JAX's abstract value of such an array, for a dtype the direct call takes (making one costs
#: ~9 µs of Python, more than the transfer of a small array); a host copy's shapes repeat (a batch, a cache's start)
_avals: dict[tuple, object] = {}
#: bound on :data:`_avals` (cleared when full)
MAX_AVALS = 512


def to_device(host: np.ndarray, device_index: int) -> jax.Array:
    """A committed array on ``tpu:device_index`` holding ``host``'s values (``host`` must not be written to
    afterwards: on XLA:CPU the array may share its memory). The same array ``jax.device_put`` returns."""
    global _direct
    target = _targets.get(device_index)
    if target is None:
        device = platform.jax_device(device_index)
        target = _targets[device_index] = (device, jax.sharding.SingleDeviceSharding(device))
    device, sharding = target
    direct = _direct
    if direct is None or type(host) is not np.ndarray:
        return jax.device_put(host, device)
    key = (host.shape, host.dtype)
    aval = _avals.get(key)
    if aval is None:
        dtype = host.dtype
        if not dtype.isnative or _canonical(dtype) != dtype:  # big-endian: the direct call reads its bytes as is
            return jax.device_put(host, device)
        if len(_avals) >= MAX_AVALS:
            _avals.clear()
        aval = _avals[key] = _shaped(*key)
    try:
        return direct(aval, sharding, [host], [device], True)
    except Exception:  # noqa: BLE001
        array = jax.device_put(host, device)  # raises the error a user should see, if there is one
        _direct = None  # the public path took what the direct one refused: JAX's internals changed
        return array
