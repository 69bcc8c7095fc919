// The tpu device's AutogradPrivateUse1 kernels in C++ (autograd_kernels.cpp): aten::linear's (backend/linear_grad.py
// says why the device has its own) and aten::scaled_dot_product_attention's (runtime/padded_attention.py).
#pragma once

#include <Python.h>

namespace torchtpu {

// Registers aten::linear's AutogradPrivateUse1 kernel: a call on plain tpu tensors goes below autograd to the tpu
// kernel when it needs no gradient, and through a C++ autograd Function with linear_grad.py's backward when it
// does; every other call to `python` (backend/linear_grad.py's linear). Once per process.
void install_linear_autograd(PyObject* python);

// Registers aten::scaled_dot_product_attention's AutogradPrivateUse1 kernel: a call on plain tpu tensors that needs
// no gradient goes below autograd to the tpu kernel (the recording kernel, which records attention over padded
// keys without Python); every other call to `python` (runtime/padded_attention.py's autograd_attention). Once per
// process.
void install_attention_autograd(PyObject* python);

}  // namespace torchtpu
