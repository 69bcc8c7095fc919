"""Runs ATen ops on tpu tensors: per-op execution, kernels for every dispatch path, mutation, views."""
