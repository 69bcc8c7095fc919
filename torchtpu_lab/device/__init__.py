"""The ``tpu`` device: tensors, storages, views, memory accounting, RNG and ``torch.tpu``."""
