// One `__slots__` attribute of a Python class, read and written through its member offset (no attribute lookup):
// how the native core reads and writes the runtime's small Python objects (Storage, the pending graph).
#pragma once

#include <Python.h>
#include <descrobject.h>
#include <structmember.h>

namespace torchtpu {

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

}  // namespace torchtpu
