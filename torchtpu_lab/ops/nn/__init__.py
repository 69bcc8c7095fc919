"""Neural-network ops, one module per family. Importing this package registers them all.

Two kinds of module, kept apart (``tests/test_ops_layout.py`` checks):

* lowerings (pure JAX functions registered with ``@lower``): :mod:`.activations` (softmax and pointwise
  activations), :mod:`.attention` (fused inference transformer kernels), :mod:`.convolution`, :mod:`.distance`,
  :mod:`.embedding` (incl. ``embedding_bag``), :mod:`.grid_sampling`, :mod:`.losses` (incl. margin and CTC),
  :mod:`.normalization`, :mod:`.pooling` (incl. adaptive and fractional), :mod:`.rnn` (fused cells),
  :mod:`.segment_reduce`, :mod:`.upsampling` (incl. antialiased; uint8 images in :mod:`.upsampling_uint8`);
* torch-level kernels (registered with ``@kernel``; they get tpu tensors and call torch ops): :mod:`.torch_kernels`
  (batch norm's running-statistics update, ``rrelu_with_noise``).

Helpers shared between modules live in :mod:`._common`.
"""

from . import (  # noqa: F401
    activations,
    attention,
    convolution,
    distance,
    embedding,
    grid_sampling,
    losses,
    normalization,
    pooling,
    rnn,
    segment_reduce,
    torch_kernels,
    upsampling,
)
