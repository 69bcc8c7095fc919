// What the native core's units share for handling the runtime's Python objects: `Slot`, one `__slots__`
// attribute read and written through its member offset (no attribute lookup: how the core reads and writes
// Storage, the pending graph, a profile's sample log), `OwnedRef`, `untracked`, and the clock Python's
// `time.perf_counter` reads (telemetry compares our timestamps with its own).
#pragma once

#include <Python.h>
#include <descrobject.h>
#include <structmember.h>

#include <ctime>

namespace torchtpu {

struct OwnedRef {  // a new reference, dropped at scope exit unless released
  PyObject* p = nullptr;
  OwnedRef() = default;
  explicit OwnedRef(PyObject* owned) : p(owned) {}
  OwnedRef(OwnedRef&& other) noexcept : p(other.release()) {}
  OwnedRef(const OwnedRef&) = delete;
  OwnedRef& operator=(const OwnedRef&) = delete;
  ~OwnedRef() { Py_XDECREF(p); }
  PyObject* release() {
    PyObject* r = p;
    p = nullptr;
    return r;
  }
};

// `obj` taken off the cyclic garbage collector's lists (returned as given, nullptr included). Only for objects
// that can never close a cycle: the pending graph's own (a node to its inputs, a placeholder to its node, key
// tuples to numbers, weak references to storages without a callback), which refer to nothing newer than
// themselves, and the memory ledger's entries (a list of an array, numbers and its origin tuple of a shape, a
// dtype and a source; the callback of its weak reference, which holds an int), which only the ledger's dicts
// hold. A recorded graph keeps thousands of them alive until its sync, and a step makes a few hundred ledger
// entries: while tracked, each counted towards the next collection and every collection walked them, and they
// were promoted until a full collection (~200 ms with torch and JAX loaded) came due.
//
// A weak reference WITH a callback stays tracked, whoever asks: when its referent is cyclic garbage, the
// collector (handle_weakrefs in CPython's gcmodule.c) moves the live weak reference from its generation's list
// onto the list of callbacks to call, and an untracked one has no list links: the process dies with SIGSEGV in
// gc.collect(). The ledger's deferred weak references met that whenever a released array was last held by a
// reference cycle, e.g. the frames of an exception's traceback that a test runner kept.
inline PyObject* untracked(PyObject* obj) {
  if (obj == nullptr || !PyObject_IS_GC(obj)) return obj;
  if (PyWeakref_Check(obj) && reinterpret_cast<PyWeakReference*>(obj)->wr_callback != nullptr) return obj;
  PyObject_GC_UnTrack(obj);
  return obj;
}

inline double monotonic() {  // time.perf_counter's clock on Linux
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Slot {
  Py_ssize_t offset = -1;
  PyObject* get(PyObject* obj) const { return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + offset); }
  void set(PyObject* obj, PyObject* value) const {  // steals nothing: takes a new reference to value
    PyObject** at = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + offset);
    PyObject* old = *at;
    Py_INCREF(value);
    *at = value;
    Py_XDECREF(old);
  }
  void set_new(PyObject* obj, PyObject* value) const {  // steals value
    PyObject** at = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + offset);
    PyObject* old = *at;
    *at = value;
    Py_XDECREF(old);
  }
};

// The object slot `name` of class `type`; offset -1 with a Python error set when it is not one.
inline Slot find_slot(PyObject* type, const char* name) {
  Slot s;
  PyObject* descr = PyObject_GetAttrString(type, name);
  if (descr == nullptr) return s;
  if (Py_TYPE(descr) != &PyMemberDescr_Type) {
    PyErr_Format(PyExc_TypeError, "torchtpu_lab native core: %s is not a __slots__ attribute of %s", name,
                 reinterpret_cast<PyTypeObject*>(type)->tp_name);
  } else {
    PyMemberDef* member = reinterpret_cast<PyMemberDescrObject*>(descr)->d_member;
    if (member->type == T_OBJECT_EX || member->type == T_OBJECT) {
      s.offset = member->offset;
    } else {
      PyErr_Format(PyExc_TypeError, "torchtpu_lab native core: %s is not an object slot", name);
    }
  }
  Py_DECREF(descr);
  return s;
}

// Readies `type` and adds it to `module` as `name` (the module holds a reference). 0, or -1 with a Python error.
inline int add_type(PyObject* module, const char* name, PyTypeObject* type) {
  if (PyType_Ready(type) < 0) return -1;
  Py_INCREF(type);
  if (PyModule_AddObject(module, name, reinterpret_cast<PyObject*>(type)) < 0) {
    Py_DECREF(type);
    return -1;
  }
  return 0;
}

}  // namespace torchtpu
