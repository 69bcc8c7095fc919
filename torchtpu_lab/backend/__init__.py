"""The wiring layer: registers the ``tpu`` device with PyTorch (PrivateUse1 rename, ``torch.tpu``, the kernel
table installed with the dispatcher, the autocast policy). It sits above the runtime and imports it; nothing
below imports this package."""
