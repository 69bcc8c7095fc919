// The output tensor of every tpu op, made in one call: the PrivateUse1 TensorImpl (sizes, strides, dtype,
// device), its Python object already of class TpuTensor, and the data model's two attributes on it.
//
// Why in C++: the pure-Python factory (`torch._C._acc.create_empty_tensor`, then `__class__` assignment, then
// three attribute writes, one of them on the storage's own Python object) costs 8-9 us per tensor on the
// project's machine, the largest part of an op's floor (docs/perf.md). Here it is one METH_FASTCALL call.
//
// The storage holds no data (tpu values live in JAX arrays): a null pointer and zero bytes on PrivateUse1, as
// the pure-Python factory's storage reports, so code that reads `data_ptr()` or `nbytes()` (tied-weight checks,
// FSDP's storage helpers) sees the same in both modes. Python's `device/tensor.py` keeps the protocol:
// `tpu_storage`/`tpu_view` on the tensor, and `_tpu_ref = (storage, view)` on the torch storage's Python object
// (autograd's shallow copies find it there).
#include <Python.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include "tensor_factory.h"


namespace torchtpu {
namespace {

PyObject* interned(const char* name) {
  PyObject* s = PyUnicode_InternFromString(name);  // kept for the process's life
  if (s == nullptr) throw python_error();
  return s;
}

// The ints of a tuple or list, or a Python TypeError naming what was wrong.
c10::SmallVector<int64_t, 6> int_list(PyObject* seq, const char* what) {
  if (!PyTuple_Check(seq) && !PyList_Check(seq)) {
    PyErr_Format(PyExc_TypeError, "new_tensor: %s must be a tuple or list of ints", what);
    throw python_error();
  }
  PyObject** items = PySequence_Fast_ITEMS(seq);
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  c10::SmallVector<int64_t, 6> out;
  out.reserve(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    long long v = PyLong_AsLongLong(items[i]);
    if (v == -1 && PyErr_Occurred()) throw python_error();
    out.push_back(v);
  }
  return out;
}

}  // namespace

PyObject* make_tensor(PyTypeObject* cls, c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype,
                      c10::DeviceIndex index, PyObject* storage_obj, PyObject* view) {
  static PyObject* s_storage = interned("tpu_storage");
  static PyObject* s_view = interned("tpu_view");
  static PyObject* s_ref = interned("_tpu_ref");
  const auto meta = c10::scalarTypeToTypeMeta(dtype);
  const auto device = c10::Device(c10::DeviceType::PrivateUse1, index);
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, c10::DataPtr(nullptr, device), /*allocator=*/nullptr,
                       /*resizable=*/false);
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), meta);
  tensor.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);

  PyObject* obj = THPVariable_Wrap(tensor, cls);
  if (obj == nullptr) return nullptr;
  PyObject* py_storage = THPStorage_Wrap(tensor.storage());
  PyObject* ref = py_storage == nullptr ? nullptr : PyTuple_Pack(2, storage_obj, view);
  if (ref == nullptr || PyObject_SetAttr(obj, s_storage, storage_obj) < 0 || PyObject_SetAttr(obj, s_view, view) < 0 ||
      PyObject_SetAttr(py_storage, s_ref, ref) < 0) {
    Py_XDECREF(ref);
    Py_XDECREF(py_storage);
    Py_DECREF(obj);
    return nullptr;
  }
  Py_DECREF(ref);
  Py_DECREF(py_storage);
  return obj;
}

// new_tensor(cls, sizes, strides, dtype, device_index, storage, view) -> a `cls` instance on tpu:device_index
// with t.tpu_storage = storage, t.tpu_view = view and t.untyped_storage()._tpu_ref = (storage, view).
// Sizes are validated by the caller (device/sizes.py gives PyTorch's CPU messages).
PyObject* new_tensor(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError, "new_tensor(cls, sizes, strides, dtype, device_index, storage, view)");
    return nullptr;
  }
  if (!PyType_Check(args[0]) || !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(args[0]),
                                                   reinterpret_cast<PyTypeObject*>(THPVariableClass))) {
    PyErr_SetString(PyExc_TypeError, "new_tensor: cls must be a torch.Tensor subclass");
    return nullptr;
  }
  auto sizes = int_list(args[1], "sizes");
  auto strides = int_list(args[2], "strides");
  TORCH_CHECK_VALUE(sizes.size() == strides.size(), "new_tensor: ", sizes.size(), " sizes but ", strides.size(),
                    " strides");
  if (!THPDtype_Check(args[3])) {
    PyErr_SetString(PyExc_TypeError, "new_tensor: dtype must be a torch.dtype");
    return nullptr;
  }
  const auto dtype = reinterpret_cast<THPDtype*>(args[3])->scalar_type;
  long index = PyLong_AsLong(args[4]);
  if (index == -1 && PyErr_Occurred()) return nullptr;

  return make_tensor(reinterpret_cast<PyTypeObject*>(args[0]), sizes, strides, dtype,
                     static_cast<c10::DeviceIndex>(index), args[5], args[6]);
  END_HANDLE_TH_ERRORS
}

}  // namespace torchtpu
