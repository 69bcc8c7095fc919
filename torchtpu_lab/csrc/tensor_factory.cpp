// The output tensor of every tpu op, made in one call: the PrivateUse1 TensorImpl (sizes, strides, dtype,
// device), its Python object already of class TpuTensor, and the data model's two attributes on it.
//
// Why in C++: the pure-Python factory (`torch._C._acc.create_empty_tensor`, then `__class__` assignment, then
// three attribute writes, one of them on the storage's own Python object) costs 8-9 us per tensor on the
// project's machine, the largest part of an op's floor (docs/perf.md). Here it is one METH_FASTCALL call.
//
// The storage holds no data (tpu values live in JAX arrays). Its data pointer is an address that stands for the
// data model's Storage (storage_address): distinct storages report distinct pointers and every view of one
// reports its base's, so code that compares `data_ptr()` to find shared memory (transformers' save_pretrained and
// tied-weight checks, safetensors, torch.save) sees what it would on CUDA. Nothing reads through it, and a read
// would fault rather than return another object's bytes. Its byte size stays 0 for a base tensor (what FSDP's
// storage helpers read, wrapped by distributed/). Python's `device/tensor.py` keeps the protocol:
// `tpu_storage`/`tpu_view` on the tensor, and the pair `(storage, view)` with the torch storage, where
// autograd's shallow copies (new TensorImpls sharing it) find it. The pure-Python factory puts the pair on the
// torch storage's Python object (`_tpu_ref`); here it is the storage's DataPtr context (`storage_ref`), so no
// Python storage object, dict and tuple are made per output: three objects the garbage collector tracked for
// every op's result, and ~5% of a recorded op.
#include <Python.h>

#include <cstdint>
#include <cstring>

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include "pyobjects.h"
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

// The DataPtr deleter of a tpu storage: drops its `(storage, view)` context (the data model's Storage alone for a
// base tensor, the pair for a view). It may run on a thread without the GIL (autograd's device threads free saved
// tensors), as PyTorch's own drop of a storage's Python object does; after the interpreter is gone the reference
// goes with the process.
void drop_ref(void* context) {
#if PY_VERSION_HEX >= 0x030D0000
  if (!Py_IsInitialized() || Py_IsFinalizing()) return;
#else
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
#endif
  PyGILState_STATE gil = PyGILState_Ensure();
  Py_DECREF(static_cast<PyObject*>(context));
  PyGILState_Release(gil);
}

// The pair as a DataPtr context: `storage` alone (view None) or `(storage, view)`; a new reference, or nullptr
// with a Python error set.
PyObject* pair_context(PyObject* storage_obj, PyObject* view) {
  return view == Py_None ? Py_NewRef(storage_obj) : PyTuple_Pack(2, storage_obj, view);
}

// The data pointer a tpu storage reports: the address of the data model's Storage object with bits 52-55 set,
// which no process maps (non-canonical on x86-64; beyond the address space under AArch64's top-byte-ignore), so
// it is unique while the Storage lives, shared by its views, and never readable.
void* storage_address(PyObject* storage_obj) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(storage_obj) | (uintptr_t{0xF} << 52));
}

// A data-less DataPtr on `device` whose context is the pair.
c10::DataPtr ref_ptr(PyObject* storage_obj, PyObject* view, c10::Device device) {
  PyObject* context = pair_context(storage_obj, view);
  if (context == nullptr) throw python_error();
  return c10::DataPtr(storage_address(storage_obj), context, &drop_ref, device);
}

// `storage` when this file made it (its DataPtr's deleter is drop_ref, its context the pair), else nullptr.
c10::StorageImpl* own_storage_impl(const c10::Storage& storage) {
  if (!storage || storage.data_ptr().get_deleter() != &drop_ref) return nullptr;
  return storage.unsafeGetStorageImpl();
}

// The torch storage of `t` when this file made it, else nullptr. `unsafe_storage` does not throw for tensors whose
// storage access does (functorch and functional wrappers).
c10::StorageImpl* own_storage_of(const at::Tensor& t) {
  return own_storage_impl(t.unsafeGetTensorImpl()->unsafe_storage());
}

c10::StorageImpl* own_storage(PyObject* t) {
  return THPVariable_Check(t) ? own_storage_of(THPVariable_Unpack(t)) : nullptr;
}

// The pair kept with `impl` (borrowed).
void data_ref_of(c10::StorageImpl* impl, PyObject** storage, PyObject** view) {
  auto* context = static_cast<PyObject*>(impl->data_ptr().get_context());
  if (PyTuple_CheckExact(context)) {  // a view's (storage, view); a base's is its Storage alone
    *storage = PyTuple_GET_ITEM(context, 0);
    *view = PyTuple_GET_ITEM(context, 1);
  } else {
    *storage = context;
    *view = Py_None;
  }
}

// Points `tensor`'s torch storage at (storage, view) (a new reference to the pair is taken). In place when only
// `tensor` holds that storage; when others hold it too (autograd's shallow copies, `.data`), `tensor` gets a
// storage of its own of the same size instead, so each TensorImpl's pair keeps matching its own geometry after
// an in-place view op (`t_()`, `squeeze_()`) changed one of them. 0, or -1 with a Python error set.
int repoint(c10::TensorImpl* tensor, PyObject* storage, PyObject* view) {
  const c10::Storage& current = tensor->unsafe_storage();
  PyObject* context = pair_context(storage, view);
  if (context == nullptr) return -1;
  c10::DataPtr ptr(storage_address(storage), context, &drop_ref, current.device());
  if (current.use_count() == 1 || !tensor->allow_tensor_metadata_change()) {
    current.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(ptr));  // drops the old pair
    return 0;
  }
  const size_t nbytes = current.nbytes();
  tensor->set_storage_keep_dtype(c10::Storage(c10::Storage::use_byte_size_t(), nbytes, std::move(ptr),
                                              /*allocator=*/nullptr, /*resizable=*/false));
  return 0;
}

// ---- the tensor class: its data attributes and a char* attribute look-up (install_tensor_class) ----

PyTypeObject* data_class = nullptr;  // the class given the descriptors below (TpuTensor), once installed
PyObject* s_tpu_storage = nullptr;
PyObject* s_tpu_view = nullptr;
PyObject* s_torch_function = nullptr;
PyObject* s_nbytes = nullptr;

void intern_names() {  // once, with the GIL held (kept for the process's life)
  if (s_tpu_storage != nullptr) return;
  s_tpu_storage = interned("tpu_storage");
  s_tpu_view = interned("tpu_view");
  s_torch_function = interned("__torch_function__");
  s_nbytes = interned("nbytes");
}

// A tensor whose torch storage make_tensor did not make (the pure-Python factory's, made before the core was
// loaded) keeps its pair in its own __dict__, as before the descriptors.
PyObject* attribute_from_dict(PyObject* self, PyObject* name) {
  OwnedRef dict(PyObject_GenericGetDict(self, nullptr));
  if (dict.p == nullptr) return nullptr;
  PyObject* value = PyDict_GetItemWithError(dict.p, name);
  if (value != nullptr) return Py_NewRef(value);
  if (!PyErr_Occurred()) {
    PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute '%U'", Py_TYPE(self)->tp_name, name);
  }
  return nullptr;
}

int attribute_to_dict(PyObject* self, PyObject* name, PyObject* value) {
  OwnedRef dict(PyObject_GenericGetDict(self, nullptr));
  if (dict.p == nullptr) return -1;
  if (value != nullptr) return PyDict_SetItem(dict.p, name, value);
  if (PyDict_DelItem(dict.p, name) == 0) return 0;
  if (PyErr_ExceptionMatches(PyExc_KeyError)) {
    PyErr_Clear();
    PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute '%U'", Py_TYPE(self)->tp_name, name);
  }
  return -1;
}

// `t.tpu_storage` / `t.tpu_view`: read from the pair kept with the tensor's torch storage, which make_tensor
// writes anyway (storage_ref), so an output tensor gets no attribute writes and no per-object dict.
PyObject* get_data_attribute(PyObject* self, void* closure) {
  const bool is_view = closure != nullptr;
  PyObject* storage;
  PyObject* view;
  if (data_ref(THPVariable_Unpack(self), &storage, &view)) return Py_NewRef(is_view ? view : storage);
  return attribute_from_dict(self, is_view ? s_tpu_view : s_tpu_storage);
}

// Writing one half re-points the pair, as set_storage_ref does (repoint).
int set_data_attribute(PyObject* self, PyObject* value, void* closure) {
  const bool is_view = closure != nullptr;
  const at::Tensor& tensor = THPVariable_Unpack(self);
  c10::StorageImpl* impl = own_storage_of(tensor);
  if (impl == nullptr) return attribute_to_dict(self, is_view ? s_tpu_view : s_tpu_storage, value);
  if (value == nullptr) {
    PyErr_Format(PyExc_AttributeError, "a tpu tensor's %s cannot be deleted", is_view ? "tpu_view" : "tpu_storage");
    return -1;
  }
  PyObject* storage;
  PyObject* view;
  data_ref_of(impl, &storage, &view);
  PyObject* new_storage = is_view ? storage : value;
  PyObject* new_view = is_view ? value : view;
  if (new_storage == storage && new_view == view) return 0;
  return repoint(tensor.unsafeGetTensorImpl(), new_storage, new_view);
}

PyGetSetDef data_attributes[] = {
    {"tpu_storage", &get_data_attribute, &set_data_attribute,
     "The device data model's Storage of this tensor (kept with its torch storage).", nullptr},
    {"tpu_view", &get_data_attribute, &set_data_attribute,
     "The device data model's View of this tensor over its Storage, None for the whole base.",
     reinterpret_cast<void*>(1)},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

// The class's `tp_getattr`: the char* attribute look-up C code uses (PyObject_GetAttrString). PyTorch's argument
// parser asks every tensor argument that is not exactly a torch.Tensor for `__torch_function__` that way
// (PyObject_FastGetAttrString), which without the slot makes and interns a new str per argument per call. The
// answer is the same generic look-up (tp_getattro) on an interned name.
PyObject* tensor_getattr(PyObject* self, char* name) {
  if (std::strcmp(name, "__torch_function__") == 0) return PyObject_GetAttr(self, s_torch_function);
  OwnedRef attr(PyUnicode_InternFromString(name));
  return attr.p == nullptr ? nullptr : PyObject_GetAttr(self, attr.p);
}

}  // namespace

bool data_ref(const at::Tensor& t, PyObject** storage, PyObject** view) {
  c10::StorageImpl* impl = own_storage_of(t);
  if (impl == nullptr) return false;
  data_ref_of(impl, storage, view);
  return true;
}

bool data_in_storage(PyTypeObject* cls) { return cls == data_class; }

// The byte size a tensor's torch storage records, as a CPU tensor's does (`untyped_storage().nbytes()`,
// `storage().size()`): a base's from its own sizes, a view's from the data model's storage (its `nbytes`).
bool storage_nbytes(c10::IntArrayRef sizes, size_t itemsize, PyObject* storage_obj, PyObject* view, size_t* nbytes) {
  if (view == Py_None) {
    *nbytes = static_cast<size_t>(c10::multiply_integers(sizes)) * itemsize;
    return true;
  }
  intern_names();
  OwnedRef n(PyObject_GetAttr(storage_obj, s_nbytes));
  if (n.p == nullptr) return false;
  *nbytes = PyLong_AsSize_t(n.p);
  return !PyErr_Occurred();
}

PyObject* make_tensor(PyTypeObject* cls, c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype,
                      c10::DeviceIndex index, PyObject* storage_obj, PyObject* view) {
  const auto meta = c10::scalarTypeToTypeMeta(dtype);
  const auto device = c10::Device(c10::DeviceType::PrivateUse1, index);
  size_t nbytes = 0;
  if (!storage_nbytes(sizes, meta.itemsize(), storage_obj, view, &nbytes)) return nullptr;
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, ref_ptr(storage_obj, view, device),
                       /*allocator=*/nullptr, /*resizable=*/false);
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), meta);
  tensor.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);

  PyObject* obj = THPVariable_Wrap(tensor, cls);
  if (obj == nullptr || cls == data_class) return obj;  // the class reads the pair from the torch storage
  intern_names();
  if (PyObject_SetAttr(obj, s_tpu_storage, storage_obj) < 0 || PyObject_SetAttr(obj, s_tpu_view, view) < 0) {
    Py_DECREF(obj);
    return nullptr;
  }
  return obj;
}

// storage_ref(t) -> (storage, view) kept with t's torch storage by new_tensor or set_storage_ref, else None
// (a tensor the pure-Python factory made, a fake or wrapper tensor, a tensor on another device).
PyObject* storage_ref(PyObject* /*module*/, PyObject* t) {
  HANDLE_TH_ERRORS
  // a torch.UntypedStorage too: `x.set_(y.untyped_storage(), ...)` names the storage, not a tensor
  c10::StorageImpl* storage = THPVariable_Check(t)  ? own_storage_of(THPVariable_Unpack(t))
                               : THPStorage_Check(t) ? own_storage_impl(THPStorage_Unpack(t))
                                                     : nullptr;
  if (storage == nullptr) Py_RETURN_NONE;
  PyObject* context = static_cast<PyObject*>(storage->data_ptr().get_context());
  if (PyTuple_CheckExact(context)) return Py_NewRef(context);
  return PyTuple_Pack(2, context, Py_None);
  END_HANDLE_TH_ERRORS
}

// set_storage_ref(t, storage, view) -> bool: point the pair kept with t's torch storage at storage/view (repoint:
// t alone, when shallow copies share that storage); False when that storage is not one new_tensor made (the
// caller keeps the pair on the storage's Python object then).
PyObject* set_storage_ref(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "set_storage_ref(tensor, storage, view)");
    return nullptr;
  }
  if (own_storage(args[0]) == nullptr) Py_RETURN_FALSE;
  if (repoint(THPVariable_Unpack(args[0]).unsafeGetTensorImpl(), args[1], args[2]) < 0) return nullptr;
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

// new_tensor(cls, sizes, strides, dtype, device_index, storage, view) -> a `cls` instance on tpu:device_index
// with t.tpu_storage = storage, t.tpu_view = view and (storage, view) kept with its torch storage (storage_ref).
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

// install_tensor_class(cls): make `cls` (TpuTensor, a torch.Tensor subclass without a tp_getattr of its own) read
// its data attributes from the pair kept with its torch storage (no per-object writes: make_tensor skips them for
// it) and answer C's char* attribute look-ups without making a str. Once per process; True when installed.
PyObject* install_tensor_class(PyObject* /*module*/, PyObject* cls) {
  HANDLE_TH_ERRORS
  if (!PyType_Check(cls) || !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls),
                                              reinterpret_cast<PyTypeObject*>(THPVariableClass))) {
    PyErr_SetString(PyExc_TypeError, "install_tensor_class: cls must be a torch.Tensor subclass");
    return nullptr;
  }
  auto* type = reinterpret_cast<PyTypeObject*>(cls);
  if (data_class == type) Py_RETURN_TRUE;
  if (data_class != nullptr || type->tp_getattr != nullptr) Py_RETURN_FALSE;
  intern_names();
  for (PyGetSetDef* def = data_attributes; def->name != nullptr; ++def) {
    OwnedRef descriptor(PyDescr_NewGetSet(type, def));
    if (descriptor.p == nullptr || PyObject_SetAttrString(cls, def->name, descriptor.p) < 0) return nullptr;
  }
  type->tp_getattr = &tensor_getattr;
  data_class = type;
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

}  // namespace torchtpu
