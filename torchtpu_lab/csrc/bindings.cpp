// torchtpu_lab._C: the Python face of the native core (the one translation unit that includes pybind).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>

#include "device.h"
#include "pyobjects.h"
#include "generator.h"
#include "geometry.h"
#include "ledger.h"
#include "lock.h"
#include "op_log.h"
#include "autograd_kernels.h"
#include "recorder.h"
#include "sync_plan.h"

namespace torchtpu {
void register_guard();
void register_hooks();
void register_profiler_stubs();
PyObject* new_tensor(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
PyObject* storage_ref(PyObject* module, PyObject* t);
PyObject* install_tensor_class(PyObject* module, PyObject* cls);
PyObject* set_storage_ref(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
}  // namespace torchtpu

namespace py = pybind11;

namespace {

// Functions on the per-op hot path, bound without pybind11's argument conversion (METH_FASTCALL).
PyObject* lesson_pending(PyObject* /*module*/, PyObject* /*unused*/) {
  return PyBool_FromLong(torchtpu::lesson_pending());
}

// untrack(*objects): pyobjects.h's `untracked` for the pending graph objects the Python path records.
PyObject* untrack(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  for (Py_ssize_t i = 0; i < nargs; ++i) torchtpu::untracked(args[i]);
  Py_RETURN_NONE;
}

PyObject* sync_targets(PyObject* /*module*/, PyObject* /*unused*/) { return torchtpu::sync_targets(); }

PyObject* segment_add(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "segment_add(segment, node)");
    return nullptr;
  }
  return torchtpu::segment_add_py(args[0], args[1]);
}

PyObject* write_placeholders(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "write_placeholders(storages, placeholders)");
    return nullptr;
  }
  return torchtpu::write_placeholders(args[0], args[1]);
}

PyObject* wrap_arrays(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "wrap_arrays(arrays, dtypes, devices)");
    return nullptr;
  }
  return torchtpu::wrap_arrays(args[0], args[1], args[2]);
}

PyObject* issue_host_copy(PyObject* /*module*/, PyObject* /*unused*/) {
  return PyLong_FromUnsignedLongLong(torchtpu::issue_host_copy());
}

PyObject* host_copies_issued(PyObject* /*module*/, PyObject* /*unused*/) {
  return PyLong_FromUnsignedLongLong(torchtpu::host_copies_issued());
}

PyMethodDef fast_methods[] = {
    {"segment_add", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&segment_add)), METH_FASTCALL,
     "segment_add(segment, node) -> bool: graph_key.Segment.add in C (False: inputs only Python keys)."},
    {"write_placeholders", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&write_placeholders)),
     METH_FASTCALL, "write_placeholders(storages, placeholders): values.set_array for each pair, in C."},
    {"sync_targets", &sync_targets, METH_NOARGS,
     "sync_targets() -> (storages, held, targets): a sync's snapshot of the pending work (recorder.h)."},
    {"untrack", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&untrack)), METH_FASTCALL,
     "untrack(*objects): take pending-graph objects that cannot close a reference cycle off the garbage "
     "collector's lists (pyobjects.h)."},
    {"lesson_pending", &lesson_pending, METH_NOARGS,
     "Whether the innermost recording-kernel call that fell back to Python can learn an entry (recorder.h)."},
    {"new_tensor", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&torchtpu::new_tensor)),
     METH_FASTCALL,
     "new_tensor(cls, sizes, strides, dtype, device_index, storage, view): a tpu tensor of class cls over "
     "storage/view, made in one call (device/tensor.py's make)."},
    {"install_tensor_class", &torchtpu::install_tensor_class, METH_O,
     "install_tensor_class(cls) -> bool: cls's tpu_storage/tpu_view read from the pair new_tensor keeps with the "
     "torch storage (no per-tensor writes), and a char* attribute look-up that makes no str (tensor_factory.cpp)."},
    {"storage_ref", &torchtpu::storage_ref, METH_O,
     "storage_ref(t) -> (storage, view) kept with t's torch storage (t: a tensor or a torch.UntypedStorage) by "
     "new_tensor, or None (device/tensor.py)."},
    {"set_storage_ref", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&torchtpu::set_storage_ref)),
     METH_FASTCALL,
     "set_storage_ref(t, storage, view) -> bool: re-point the pair kept with t's torch storage (False: not one "
     "new_tensor made)."},
    {"ledger_acquire", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&torchtpu::ledger_acquire_py)),
     METH_FASTCALL, "acquire(array, device_index, nbytes, origin=None): device/memory.py's acquire (ledger.h)."},
    {"ledger_release", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&torchtpu::ledger_release_py)),
     METH_FASTCALL, "release(array): device/memory.py's release (ledger.h)."},
    {"ledger_settle", &torchtpu::ledger_settle_py, METH_NOARGS, "device/memory.py's settle (ledger.h)."},
    {"store_all", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&torchtpu::store_all_py)),
     METH_FASTCALL, "store_all(storages, values): storage.array = value for each pair (ledger.h)."},
    {"donate", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&torchtpu::donate_py)), METH_FASTCALL,
     "donate(leaves, candidates, reusable) -> tuple: runtime/fused.py's _donate (sync_plan.h)."},
    {"alias_order", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&torchtpu::alias_order_py)),
     METH_FASTCALL,
     "alias_order(targets, leaves, leaf_sigs, donate, storages, held, prior) -> list | None: runtime/fused.py's "
     "_alias_order (sync_plan.h)."},
    {"commit", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&torchtpu::commit_py)), METH_FASTCALL,
     "commit(targets, results): target.value = result for each pair (sync_plan.h)."},
    {"wrap_arrays", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&wrap_arrays)), METH_FASTCALL,
     "wrap_arrays(arrays, dtypes, devices) -> list: tensor.from_array for each array, in C."},
    {"issue_host_copy", &issue_host_copy, METH_NOARGS,
     "issue_host_copy() -> int: the number of a new non-blocking copy to the host (events recorded after it "
     "cover it; runtime/host_copies.py)."},
    {"host_copies_issued", &host_copies_issued, METH_NOARGS,
     "host_copies_issued() -> int: how many non-blocking copies to the host were issued."},
    {nullptr, nullptr, 0, nullptr}};

// The Python callables the guard's synchronize and event calls run; leaked on purpose (they must outlive
// interpreter shutdown, when destroying a Python object from a static destructor would crash).
py::object* synchronize_fn = nullptr;
py::object* event_fn = nullptr;

void call_synchronize(c10::DeviceIndex index) {
  py::gil_scoped_acquire gil;
  try {
    (*synchronize_fn)(static_cast<int>(index));
  } catch (py::error_already_set& e) {
    e.restore();  // the Python exception (a Ctrl-C too) reaches the caller unchanged
    throw python_error();
  }
}

bool call_event(c10::DeviceIndex index, uint64_t upto, bool wait) {
  py::gil_scoped_acquire gil;
  try {
    return (*event_fn)(static_cast<int>(index), upto, wait).cast<bool>();
  } catch (py::error_already_set& e) {
    e.restore();
    throw python_error();
  }
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchtpu_lab's native core: the PrivateUse1 device guard, hooks, generators and pinned memory";
  m.def("register", [] {
    torchtpu::register_guard();
    torchtpu::register_hooks();
    torchtpu::register_profiler_stubs();
  }, "Register the tpu guard, hooks and profiler stubs with PyTorch (once per process).");
  m.def("set_device_count", [](int n) { torchtpu::set_device_count(static_cast<c10::DeviceIndex>(n)); });
  m.def("device_count", [] { return static_cast<int>(torchtpu::device_count()); });
  m.def("current_device", [] { return static_cast<int>(torchtpu::current_device()); });
  m.def("set_current_device", [](int i) { torchtpu::set_current_device(static_cast<c10::DeviceIndex>(i)); });
  m.def("set_synchronize", [](py::object fn) {
    if (synchronize_fn == nullptr) synchronize_fn = new py::object();
    *synchronize_fn = std::move(fn);
    torchtpu::set_sync_hook(&call_synchronize);
  }, "fn(device_index): what torch.accelerator/Stream synchronize run for a tpu device.");
  m.def("set_event_hook", [](py::object fn) {
    if (event_fn == nullptr) event_fn = new py::object();
    *event_fn = std::move(fn);
    torchtpu::set_event_hook(&call_event);
  }, "fn(device_index, upto, wait) -> bool: what torch.Event synchronize (wait) and query run for a tpu event.");
  if (PyModule_AddFunctions(m.ptr(), fast_methods) < 0) throw py::error_already_set();
  if (torchtpu::add_lock_type(m.ptr()) < 0) throw py::error_already_set();
  if (torchtpu::add_op_log_type(m.ptr()) < 0) throw py::error_already_set();
  m.def("default_generator", [](int i) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_Wrap(torchtpu::default_generator(static_cast<c10::DeviceIndex>(i))));
  }, "The default torch.Generator of tpu:i.");
  m.def("configure_ledger", [](py::dict config) {
    if (torchtpu::configure_ledger(config.ptr()) < 0) throw py::error_already_set();
  }, "Hand the memory ledger device/memory.py's dicts, lock and listeners (ledger.h).");
  m.def("storage_finalizer", [](py::handle storage_type) {
    PyObject* d = torchtpu::storage_finalizer(storage_type.ptr());
    if (d == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(d);
  }, "Storage.__del__ as a C method: releases the storage's array to the ledger.");
  m.def("configure_recorder", [](py::dict config) { torchtpu::configure_recorder(config.ptr()); },
        "Hand the recording kernel the Python objects it reads and writes (runtime/recording.py).");
  m.def("install_recording_kernels", [](py::sequence ops) { torchtpu::install_recording_kernels(ops.ptr()); },
        "Make each (schema name, overload, python kernel)'s PrivateUse1 kernel a recording kernel.");
  m.def("learn", [](py::handle name, py::handle overload, py::handle compiled, py::list dyn, py::sequence sources,
                    py::handle signature) {
    return torchtpu::learn(name.ptr(), overload.ptr(), compiled.ptr(), dyn.ptr(), sources.ptr(),
                           signature.is_none() ? nullptr : signature.ptr());
  }, "File an executable under the key of the innermost recording-kernel call that fell back to Python "
     "(recorded as a node keyed `signature`, when not None, in place of its own).",
        py::arg("name"), py::arg("overload"), py::arg("compiled"), py::arg("dyn"), py::arg("sources"),
        py::arg("signature") = py::none());
  m.def("learn_unsized", [](int kind, py::handle compiled, py::handle signature, py::list dyn,
                            py::sequence sources) {
    return torchtpu::learn_unsized(static_cast<char>(kind), compiled.ptr(), signature.ptr(), dyn.ptr(),
                                   sources.ptr());
  }, "Teach the recording kernel a call it keyed without its length: an append into spare capacity (kind 1), "
     "attention over padded keys (kind 2) (recorder.h).");
  m.def("learn_strict", [](py::handle name, py::handle overload, py::handle compiled, py::handle call, long device,
                           py::list dyn, py::sequence sources) {
    return torchtpu::learn_strict(name.ptr(), overload.ptr(), compiled.ptr(), call.ptr(), device, dyn.ptr(),
                                  sources.ptr());
  }, "File a strict-mode executable call under the key of the innermost recording-kernel call that fell back.");
  m.def("learn_view", [](py::handle name, py::handle overload, py::handle view, py::handle size, py::handle stride,
                         long offset, bool reported) {
    return torchtpu::learn_view(name.ptr(), overload.ptr(), view.ptr(), size.ptr(), stride.ptr(), offset, reported);
  }, "File a view op's output geometry under the key of the innermost recording-kernel call that fell back.");
  m.def("learn_views", [](py::handle name, py::handle overload, py::list outputs) {
    return torchtpu::learn_views(name.ptr(), overload.ptr(), outputs.ptr());
  }, "The same for a view op with a list of outputs: one (view, size, stride, offset, reported) per output.");
  m.def("install_linear_autograd", [](py::handle fn) { torchtpu::install_linear_autograd(fn.ptr()); },
        "aten::linear's AutogradPrivateUse1 kernel: no-gradient calls below autograd in C++, others to fn.");
  m.def("install_attention_autograd", [](py::handle fn) { torchtpu::install_attention_autograd(fn.ptr()); },
        "aten::scaled_dot_product_attention's AutogradPrivateUse1 kernel: no-gradient calls on plain tpu tensors "
        "below autograd in C++, others to fn.");
  m.def("clear_recorded", &torchtpu::clear_recorded, "Forget every learned entry.");
  m.def("recorder_stats", [] { return py::reinterpret_steal<py::object>(torchtpu::recorder_stats()); },
        "Calls recorded in C++, handed to Python, entries learned.");
  m.def("set_geometry", [](py::handle t, const std::vector<int64_t>& size, const std::vector<int64_t>& stride,
                           int64_t offset, size_t nbytes) {
    TORCH_CHECK(THPVariable_Check(t.ptr()), "torchtpu_lab: set_geometry expects a tensor");
    torchtpu::set_geometry(THPVariable_Unpack(t.ptr()).unsafeGetTensorImpl(), size, stride, offset, nbytes);
  }, "Report (size, stride, offset) as a tpu tensor's torch geometry; its storage records >= nbytes.");
}
