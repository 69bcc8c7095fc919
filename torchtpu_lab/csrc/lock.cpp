// lock.h's Lock: a PyThread lock held while any thread owns the Lock, plus its owner's thread ident and the
// owner's nesting depth. Owner and depth are read and written only under the GIL, so the owner check needs no
// atomics; the PyThread lock is what another thread waits on, with the GIL released.
#include "lock.h"

#include "pyobjects.h"

#include <chrono>
#include <climits>

namespace torchtpu {
namespace {

struct LockObject {
  PyObject_HEAD
  PyThread_type_lock lock;
  unsigned long owner;
  unsigned long depth;  // 0: nobody holds it
  PyObject* refusal;    // set by refuse(): every acquire fails with RuntimeError(refusal)
};

bool owned_here(const LockObject* self) { return self->depth > 0 && self->owner == PyThread_get_thread_ident(); }

// The outermost acquire after the PyThread lock was taken.
void take(LockObject* self) {
  self->owner = PyThread_get_thread_ident();
  self->depth = 1;
}

// Waits for the PyThread lock with the GIL released, for `timeout` seconds (< 0: no limit). A signal that
// interrupts the wait runs its Python handler here (a Ctrl-C raises out of acquire, as it does out of RLock's).
// 1: taken; 0: timed out; -1: a handler raised.
int wait_for(LockObject* self, double timeout) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(
                                           timeout < 0 ? 0.0 : timeout));
  for (;;) {
    PY_TIMEOUT_T wait_us = -1;
    if (timeout >= 0) {
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - clock::now()).count();
      wait_us = left > 0 ? static_cast<PY_TIMEOUT_T>(left) : 0;
    }
    PyLockStatus got;
    Py_BEGIN_ALLOW_THREADS
    got = PyThread_acquire_lock_timed(self->lock, wait_us, /*intr_flag=*/1);
    Py_END_ALLOW_THREADS
    if (got == PY_LOCK_ACQUIRED) return 1;
    if (got == PY_LOCK_FAILURE) return 0;
    if (Py_MakePendingCalls() < 0) return -1;  // PY_LOCK_INTR: run the signal handlers, then wait again
  }
}

PyObject* acquire(PyObject* obj, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  auto* self = reinterpret_cast<LockObject*>(obj);
  PyObject* blocking_obj = nargs > 0 ? args[0] : nullptr;
  PyObject* timeout_obj = nargs > 1 ? args[1] : nullptr;
  if (nargs > 2) {
    PyErr_SetString(PyExc_TypeError, "acquire() takes at most 2 arguments (blocking, timeout)");
    return nullptr;
  }
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t i = 0; i < nkw; ++i) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, i);
    if (PyUnicode_CompareWithASCIIString(name, "blocking") == 0) {
      blocking_obj = args[nargs + i];
    } else if (PyUnicode_CompareWithASCIIString(name, "timeout") == 0) {
      timeout_obj = args[nargs + i];
    } else {
      PyErr_Format(PyExc_TypeError, "acquire() got an unexpected keyword argument '%U'", name);
      return nullptr;
    }
  }
  int blocking = 1;
  if (blocking_obj != nullptr && (blocking = PyObject_IsTrue(blocking_obj)) < 0) return nullptr;
  double timeout = -1.0;
  if (timeout_obj != nullptr && (timeout = PyFloat_AsDouble(timeout_obj)) == -1.0 && PyErr_Occurred()) return nullptr;
  if (!blocking && timeout != -1.0) {
    PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
    return nullptr;
  }
  if (timeout < 0 && timeout != -1.0) {
    PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
    return nullptr;
  }
  if (timeout * 1e6 > static_cast<double>(PY_TIMEOUT_MAX)) {
    PyErr_SetString(PyExc_OverflowError, "timeout value is too large");
    return nullptr;
  }
  if (self->refusal != nullptr) {
    PyErr_SetObject(PyExc_RuntimeError, self->refusal);
    return nullptr;
  }
  if (owned_here(self) && self->depth == ULONG_MAX) {
    PyErr_SetString(PyExc_OverflowError, "Internal lock count overflowed");
    return nullptr;
  }
  if (lock_try_acquire(obj)) Py_RETURN_TRUE;  // re-entered, or free
  if (!blocking) Py_RETURN_FALSE;
  const int got = wait_for(self, timeout);
  if (got < 0) return nullptr;
  if (got == 0) Py_RETURN_FALSE;
  take(self);
  Py_RETURN_TRUE;
}

PyObject* release(PyObject* obj, PyObject* /*unused*/) {
  auto* self = reinterpret_cast<LockObject*>(obj);
  if (!owned_here(self)) {
    PyErr_SetString(PyExc_RuntimeError, "cannot release un-acquired lock");
    return nullptr;
  }
  lock_release(obj);
  Py_RETURN_NONE;
}

PyObject* enter(PyObject* obj, PyObject* /*unused*/) { return acquire(obj, nullptr, 0, nullptr); }

PyObject* exit_(PyObject* obj, PyObject* const* /*args*/, Py_ssize_t /*nargs*/) { return release(obj, nullptr); }

// refuse(message): from now on every acquire raises RuntimeError(message) and the recording kernel's plain C
// acquire fails (its call goes to the Python kernel, whose acquire raises). For a process that must not reach the
// runtime at all: a child forked after the device started (backend/fork_guard.py).
PyObject* refuse(PyObject* obj, PyObject* message) {
  auto* self = reinterpret_cast<LockObject*>(obj);
  Py_XSETREF(self->refusal, Py_NewRef(message));
  Py_RETURN_NONE;
}

PyObject* is_owned(PyObject* obj, PyObject* /*unused*/) {
  return PyBool_FromLong(owned_here(reinterpret_cast<LockObject*>(obj)));
}

PyObject* repr(PyObject* obj) {
  auto* self = reinterpret_cast<LockObject*>(obj);
  return PyUnicode_FromFormat("<torchtpu_lab Lock %s owner=%lu count=%lu at %p>",
                              self->depth > 0 ? "locked" : "unlocked", self->depth > 0 ? self->owner : 0UL,
                              self->depth, obj);
}

PyObject* new_lock(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  if (PyTuple_GET_SIZE(args) != 0 || (kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0)) {
    PyErr_SetString(PyExc_TypeError, "Lock() takes no arguments");
    return nullptr;
  }
  auto* self = reinterpret_cast<LockObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->lock = PyThread_allocate_lock();
  if (self->lock == nullptr) {
    Py_DECREF(self);
    PyErr_SetString(PyExc_MemoryError, "can't allocate lock");
    return nullptr;
  }
  self->owner = 0;
  self->depth = 0;
  self->refusal = nullptr;
  return reinterpret_cast<PyObject*>(self);
}

void dealloc(PyObject* obj) {
  auto* self = reinterpret_cast<LockObject*>(obj);
  Py_CLEAR(self->refusal);
  if (self->lock != nullptr) {
    if (self->depth > 0) PyThread_release_lock(self->lock);
    PyThread_free_lock(self->lock);
  }
  Py_TYPE(obj)->tp_free(obj);
}

PyMethodDef methods[] = {
    {"acquire", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&acquire)),
     METH_FASTCALL | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> bool, as threading.RLock's (re-entrant; waits with the GIL released)."},
    {"release", &release, METH_NOARGS, "Release one level; RuntimeError when this thread does not hold the lock."},
    {"__enter__", &enter, METH_NOARGS, "acquire()"},
    {"__exit__", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&exit_)), METH_FASTCALL, "release()"},
    {"_is_owned", &is_owned, METH_NOARGS, "Whether this thread holds the lock (threading.RLock's name)."},
    {"refuse", &refuse, METH_O, "refuse(message): every later acquire raises RuntimeError(message)."},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject lock_type = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "torchtpu_lab._C.Lock";
  t.tp_basicsize = sizeof(LockObject);
  t.tp_flags = Py_TPFLAGS_DEFAULT;
  t.tp_doc = "The runtime's re-entrant lock: threading.RLock's semantics; its recording kernel takes it in C.";
  t.tp_new = &new_lock;
  t.tp_dealloc = &dealloc;
  t.tp_repr = &repr;
  t.tp_methods = methods;
  return t;
}();

}  // namespace

int add_lock_type(PyObject* module) { return add_type(module, "Lock", &lock_type); }

bool is_lock(PyObject* obj) { return Py_TYPE(obj) == &lock_type; }

bool lock_try_acquire(PyObject* obj) {
  auto* self = reinterpret_cast<LockObject*>(obj);
  if (self->refusal != nullptr) return false;  // the Python path raises the refusal
  if (owned_here(self)) {
    if (self->depth == ULONG_MAX) return false;  // the Python path raises RLock's OverflowError
    ++self->depth;
    return true;
  }
  if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) return false;
  take(self);
  return true;
}

void lock_release(PyObject* obj) {
  auto* self = reinterpret_cast<LockObject*>(obj);
  if (--self->depth == 0) {
    self->owner = 0;
    PyThread_release_lock(self->lock);
  }
}

bool lock_owned(PyObject* obj) { return owned_here(reinterpret_cast<LockObject*>(obj)); }

}  // namespace torchtpu
