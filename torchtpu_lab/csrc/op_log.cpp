// OpLog: a recorder's op records as a C vector (op_log.h).
#include "op_log.h"

#include "pyobjects.h"

#include <new>
#include <vector>

namespace torchtpu {
namespace {

struct Record {
  PyObject* name;  // each reference owned by the log
  PyObject* hit;
  PyObject* source;
  PyObject* stack;
  double t;
  double dur;
};

struct OpLogObject {
  PyObject_HEAD
  std::vector<Record>* records;
};

extern PyTypeObject op_log_type;

void dealloc(PyObject* obj) {
  auto* self = reinterpret_cast<OpLogObject*>(obj);
  if (self->records != nullptr) {
    for (const Record& r : *self->records) {
      Py_DECREF(r.name);
      Py_DECREF(r.hit);
      Py_DECREF(r.source);
      Py_DECREF(r.stack);
    }
    delete self->records;
  }
  Py_TYPE(obj)->tp_free(obj);
}

Py_ssize_t length(PyObject* obj) {
  return static_cast<Py_ssize_t>(reinterpret_cast<OpLogObject*>(obj)->records->size());
}

// fields(): the records flat, OP_FIELDS per op, as telemetry.record_op appends them (after its marker).
PyObject* fields(PyObject* obj, PyObject* /*unused*/) {
  const std::vector<Record>& records = *reinterpret_cast<OpLogObject*>(obj)->records;
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(records.size() * 6));
  if (out == nullptr) return nullptr;
  Py_ssize_t i = 0;
  for (const Record& r : records) {
    PyObject* t = PyFloat_FromDouble(r.t);
    PyObject* dur = PyFloat_FromDouble(r.dur);
    if (t == nullptr || dur == nullptr) {
      Py_XDECREF(t);
      Py_XDECREF(dur);
      Py_DECREF(out);
      return nullptr;
    }
    for (PyObject* field : {Py_NewRef(r.name), t, dur, Py_NewRef(r.hit), Py_NewRef(r.source), Py_NewRef(r.stack)}) {
      PyList_SET_ITEM(out, i++, field);
    }
  }
  return out;
}

PyMethodDef methods[] = {
    {"fields", &fields, METH_NOARGS,
     "The records flat: (name, t, dur, cache_hit, source, stack) per op, as telemetry.record_op appends them."},
    {nullptr, nullptr, 0, nullptr}};

PySequenceMethods as_sequence = [] {
  PySequenceMethods s{};
  s.sq_length = &length;
  return s;
}();

PyTypeObject op_log_type = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "torchtpu_lab._C.OpLog";
  t.tp_basicsize = sizeof(OpLogObject);
  t.tp_flags = Py_TPFLAGS_DEFAULT;  // not collected: it refers to names, sources and stacks, never to itself
  t.tp_doc = "Consecutive op records the recording kernel noted in a profile's list (telemetry.expand reads it).";
  t.tp_dealloc = &dealloc;
  t.tp_methods = methods;
  t.tp_as_sequence = &as_sequence;
  return t;
}();

PyObject* new_log() {
  auto* self = PyObject_New(OpLogObject, &op_log_type);
  if (self == nullptr) return nullptr;
  self->records = new (std::nothrow) std::vector<Record>();
  if (self->records == nullptr) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  return reinterpret_cast<PyObject*>(self);
}

}  // namespace

int add_op_log_type(PyObject* module) { return add_type(module, "OpLog", &op_log_type); }

int log_op(PyObject* sink, PyObject* name, double t, double dur, PyObject* hit, PyObject* source, PyObject* stack) {
  const Py_ssize_t n = PyList_GET_SIZE(sink);
  PyObject* last = n > 0 ? PyList_GET_ITEM(sink, n - 1) : nullptr;
  if (last == nullptr || Py_TYPE(last) != &op_log_type) {
    PyObject* log = new_log();
    if (log == nullptr) return -1;
    const int rc = PyList_Append(sink, log);
    Py_DECREF(log);  // the list holds it
    if (rc < 0) return -1;
    last = log;
  }
  try {
    reinterpret_cast<OpLogObject*>(last)->records->push_back(
        {Py_NewRef(name), Py_NewRef(hit), Py_NewRef(source), Py_NewRef(stack), t, dur});
  } catch (const std::bad_alloc&) {
    Py_DECREF(name);
    Py_DECREF(hit);
    Py_DECREF(source);
    Py_DECREF(stack);
    PyErr_NoMemory();
    return -1;
  }
  return 0;
}

}  // namespace torchtpu
