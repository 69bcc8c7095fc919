// aten::linear's autograd on the tpu device, in C++ (linear_autograd.cpp; backend/linear_grad.py says why).
#pragma once

#include <Python.h>

namespace torchtpu {

// Registers aten::linear's AutogradPrivateUse1 kernel: a call on plain tpu tensors goes below autograd to the tpu
// kernel when it needs no gradient, and through a C++ autograd Function with linear_grad.py's backward when it
// does; every other call to `python` (backend/linear_grad.py's linear). Once per process.
void install_linear_autograd(PyObject* python);

}  // namespace torchtpu
