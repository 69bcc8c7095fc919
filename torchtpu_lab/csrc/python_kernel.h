// Calling one of our Python kernels from a boxed C++ kernel (recorder.cpp's path for every call it does not
// record itself), with the arguments PyTorch hands a Python kernel registered through torch.library.
#pragma once

#include <Python.h>

#include <ATen/core/dispatch/Dispatcher.h>

namespace torchtpu {

// Pops the op's arguments off `stack`, calls `fn(*args, **kwargs)` and pushes its results. The GIL is held by
// the caller; a Python exception propagates as python_error (the dispatcher carries it to the caller's frame).
void call_python_kernel(PyObject* fn, const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torchtpu
