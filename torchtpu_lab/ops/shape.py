"""shape ops."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .registry import aten, lower
