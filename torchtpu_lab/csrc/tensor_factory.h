// The output tensor of every tpu op, made in one call (tensor_factory.cpp): shared by the Python-facing
// `new_tensor` and the recording kernel (recorder.cpp), which makes its outputs without entering Python.
#pragma once

#include <Python.h>

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/core/Device.h>

namespace at {
class Tensor;
}

namespace torchtpu {

// A new reference to a `cls` instance (a torch.Tensor subclass) on tpu:index with the given sizes, strides and
// dtype, `tpu_storage = storage`, `tpu_view = view` on it and `(storage, view)` kept with its torch storage
// (storage_ref); nullptr with a Python error set on failure.
PyObject* make_tensor(PyTypeObject* cls, c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype,
                      c10::DeviceIndex index, PyObject* storage, PyObject* view);

// The (storage, view) pair kept with `t`'s torch storage, borrowed (they live as long as that storage); false
// when make_tensor did not make it.
bool data_ref(const at::Tensor& t, PyObject** storage, PyObject** view);

// Whether `cls`'s `tpu_storage`/`tpu_view` are read from that pair (install_tensor_class): then the pair and
// the attributes cannot disagree.
bool data_in_storage(PyTypeObject* cls);

}  // namespace torchtpu
