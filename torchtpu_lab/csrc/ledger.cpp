// The device-memory ledger's hot half: device/memory.py's `acquire`, `release` and `settle`, `Storage.__del__`,
// and a sync's commit of its results into their storages (`store_all`), in C.
//
// Every storage that takes or drops a JAX array tells the ledger: in strict mode once per op output, in fused
// mode once per graph output, and every dropped tensor's storage is finalized. In Python that was five function
// frames, an RLock and a closure per buffer (~9 us of a ~28 us strict op). Here it is the same steps on the
// same objects: memory.py's dicts (`_live`, `_deferred`, `_allocated`, `_peak`, `_since_sample`, `_counts`),
// under its `_lock`, telling its listeners through its `_notify` (Python, only while a listener is registered)
// and writing the open profiles' sample logs itself (`sample`).
// So memory.py's readers (stats, owners at the peak, live buffers), its `settle` and `executing`, and the pure-
// Python mode keep one data model; only the writes moved.
//
// A released buffer that something else still references (a pending graph reads it) stays counted until the
// array object is gone: a weak reference whose callback is a C function bound to the buffer's key.
// No Python code runs here except the listeners' notifier, a sample log's peak callback (memory._peak_reached,
// which never raises) and the lock's acquire when another thread holds it;
// every step that can fail comes before the first change of the counts.
#include "ledger.h"

#include "lock.h"

#include "pyobjects.h"

namespace torchtpu {
namespace {

struct Ledger {
  bool ready = false;
  PyObject* live = nullptr;          // id(array) -> [array, holders, device, bytes, origin]
  PyObject* deferred = nullptr;      // id(array) -> [weakref, device, bytes, origin]
  PyObject* allocated = nullptr;     // device -> bytes
  PyObject* peak = nullptr;          // device -> bytes
  PyObject* since_sample = nullptr;  // device -> bytes
  PyObject* counts = nullptr;        // {"alloc": n, "free": n}
  PyObject* listeners = nullptr;     // list; `notify(kind, bytes, device)` is called while it is non-empty
  PyObject* notify = nullptr;
  PyObject* sample_logs = nullptr;   // list of memory.SampleLog, written here while non-empty
  PyObject* peak_reached = nullptr;  // memory._peak_reached(log, t, allocated, kind, bytes): never raises
  PyTypeObject* sample_log_type = nullptr;
  Slot log_device, log_samples, log_above;
  PyObject* lock_acquire = nullptr;  // _lock.acquire / _lock.release (re-entrant: a finalizer may run mid-update)
  PyObject* lock_release = nullptr;
  PyObject* native_lock = nullptr;   // memory._lock when it is the core's Lock (lock.h), else nullptr
  PyObject* array_types = nullptr;   // storage._ARRAY_TYPES: type -> whether its instances are JAX arrays
  PyObject* is_array = nullptr;      // storage.is_array, for a type not in that dict yet
  PyObject* alloc_str = nullptr;
  PyObject* free_str = nullptr;
  PyObject* is_deleted_str = nullptr;
  PyObject* one = nullptr;
  PyObject* zero = nullptr;
  Slot storage_array;                // Storage._array and the fields an acquire reads
  Slot storage_shape, storage_dtype, storage_device, storage_nbytes, storage_source;
} L;

// Holds memory._lock for a scope; `ok` is false (a Python error set) when acquiring it failed. With the core's
// own Lock (lock.h, what storage.use_native_ledger gives memory.py) the uncontended acquire and every release are
// plain C calls; a lock another thread holds is waited for through its Python acquire (the GIL released).
struct Locked {
  bool ok;
  Locked() {
    if (L.native_lock != nullptr && lock_try_acquire(L.native_lock)) {
      ok = true;
      return;
    }
    PyObject* r = PyObject_CallNoArgs(L.lock_acquire);
    ok = r != nullptr;
    Py_XDECREF(r);
  }
  ~Locked() {
    if (!ok) return;
    if (L.native_lock != nullptr) {  // held by this thread, however it was taken: releasing runs no bytecode
      lock_release(L.native_lock);
      return;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject* r = PyObject_CallNoArgs(L.lock_release);
    if (r == nullptr) PyErr_Clear();  // releasing a lock this thread owns does not fail
    Py_XDECREF(r);
    PyErr_Restore(type, value, tb);
  }
};

// id(array), the ledger's dict key, owned for a scope (`p` is nullptr with a Python error set when it failed).
struct Key {
  PyObject* p;
  explicit Key(PyObject* array) : p(PyLong_FromVoidPtr(array)) {}
  ~Key() { Py_XDECREF(p); }
  Key(const Key&) = delete;
  Key& operator=(const Key&) = delete;
};

// d[key] = d.get(key, 0) + delta (or - delta); 0 or -1.
int add_to(PyObject* d, PyObject* key, PyObject* delta, bool subtract = false) {
  PyObject* old = PyDict_GetItemWithError(d, key);
  if (old == nullptr && PyErr_Occurred()) return -1;
  PyObject* now = subtract ? PyNumber_Subtract(old != nullptr ? old : L.zero, delta)
                           : PyNumber_Add(old != nullptr ? old : L.zero, delta);
  if (now == nullptr) return -1;
  int rc = PyDict_SetItem(d, key, now);
  Py_DECREF(now);
  return rc;
}

// if total > d.get(key, 0): d[key] = total; 0 or -1.
int raise_to(PyObject* d, PyObject* key, PyObject* total) {
  PyObject* old = PyDict_GetItemWithError(d, key);
  if (old == nullptr && PyErr_Occurred()) return -1;
  int above = PyObject_RichCompareBool(total, old != nullptr ? old : L.zero, Py_GT);
  if (above <= 0) return above;
  return PyDict_SetItem(d, key, total);
}

// The bytes allocated on `device` now (a new reference), or nullptr with a Python error set.
PyObject* allocated_now(PyObject* device) {
  PyObject* total = PyDict_GetItemWithError(L.allocated, device);
  if (total == nullptr && PyErr_Occurred()) return nullptr;
  return Py_NewRef(total != nullptr ? total : L.zero);
}

// memory._sample's steps: (t, allocated, kind, bytes) appended to the sample log of every open profile on
// `device`, and its on_peak told when allocated passed its mark; `allocated` as of the sample (steals it). 0 or -1.
int sample_at(PyObject* kind, PyObject* nbytes, PyObject* device, PyObject* allocated) {
  OwnedRef now(allocated);  // owned: on_peak runs Python
  OwnedRef t(PyFloat_FromDouble(monotonic()));
  if (t.p == nullptr) return -1;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(L.sample_logs); ++i) {
    OwnedRef log(Py_NewRef(PyList_GET_ITEM(L.sample_logs, i)));
    if (Py_TYPE(log.p) != L.sample_log_type) continue;
    const int same = PyObject_RichCompareBool(L.log_device.get(log.p), device, Py_EQ);
    if (same < 0) return -1;
    if (same == 0) continue;
    PyObject* samples = L.log_samples.get(log.p);
    if (!PyList_Check(samples)) continue;
    PyObject* fields[] = {t.p, now.p, kind, nbytes};
    for (PyObject* field : fields) {
      if (PyList_Append(samples, field) < 0) return -1;
    }
    const int above = PyObject_RichCompareBool(now.p, L.log_above.get(log.p), Py_GT);
    if (above < 0) return -1;
    if (above > 0) {
      PyObject* args[] = {log.p, t.p, now.p, kind, nbytes};
      PyObject* r = PyObject_Vectorcall(L.peak_reached, args, 5, nullptr);
      Py_XDECREF(r);
      if (r == nullptr) return -1;
    }
  }
  return 0;
}

int sample(PyObject* kind, PyObject* nbytes, PyObject* device) {
  PyObject* now = allocated_now(device);
  return now == nullptr ? -1 : sample_at(kind, nbytes, device, now);
}

// While a sync commits its results (store_all) or frees what its graph alone still read (settle), the samples of
// consecutive allocations (or frees) on one device are one sample: their bytes, at the level after the last of
// them. A training step's sync commits and frees a hundred buffers at one moment; a sample each was a float, four
// appends and two comparisons per buffer in every profiled step, and the chart cannot tell them apart. A change
// of the other kind writes the pending sample first (`coalesced_before`), so every level the device passed
// through, its peak included, is still a sample, and on_peak sees the owners of that level. Listeners are told
// of each buffer, as outside a sync.
struct Coalesced {
  int depth = 0;             // store_all / settle scopes open
  PyObject* kind = nullptr;  // L.alloc_str or L.free_str (owned by L); nullptr: nothing pending
  PyObject* device = nullptr;
  long long nbytes = 0;
  PyObject* allocated = nullptr;  // the level after the last of them
} C;

// Writes the pending sample, if any. 0 or -1.
int flush_coalesced() {
  if (C.kind == nullptr) return 0;
  PyObject* kind = C.kind;
  OwnedRef device(C.device);
  PyObject* allocated = C.allocated;
  C.kind = C.device = C.allocated = nullptr;  // on_peak may run Python, which may allocate
  OwnedRef nbytes(PyLong_FromLongLong(C.nbytes));
  C.nbytes = 0;
  if (nbytes.p == nullptr) {
    Py_DECREF(allocated);
    return -1;
  }
  return sample_at(kind, nbytes.p, device.p, allocated);
}

// Before a change of `kind` on the counts: the pending sample of the other kind is written at its own level.
int coalesced_before(PyObject* kind) {
  return C.depth > 0 && C.kind != nullptr && C.kind != kind ? flush_coalesced() : 0;
}

int coalesce(PyObject* kind, PyObject* nbytes, PyObject* device) {
  const long long n = PyLong_AsLongLong(nbytes);
  if (n == -1 && PyErr_Occurred()) return -1;
  while (C.kind != nullptr) {  // a flush runs on_peak (Python), which may free a buffer: its sample then pends
    const int same = C.kind == kind ? PyObject_RichCompareBool(C.device, device, Py_EQ) : 0;
    if (same < 0) return -1;
    if (same == 1) break;
    if (flush_coalesced() < 0) return -1;
  }
  PyObject* now = allocated_now(device);
  if (now == nullptr) return -1;
  if (C.kind == nullptr) {
    C.kind = kind;
    C.device = Py_NewRef(device);
  }
  C.nbytes += n;
  Py_XSETREF(C.allocated, now);
  return 0;
}

// A store_all or settle: its samples coalesced until the outermost scope ends (`finish`, or the destructor on an
// error, which keeps the error that is set).
struct CoalescedScope {
  bool open = true;
  CoalescedScope() { ++C.depth; }
  int finish() {
    open = false;
    return --C.depth == 0 ? flush_coalesced() : 0;
  }
  ~CoalescedScope() {
    if (!open) return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (finish() < 0) PyErr_Clear();
    PyErr_Restore(type, value, tb);
  }
};

int tell(PyObject* kind, PyObject* nbytes, PyObject* device) {
  if (PyList_GET_SIZE(L.sample_logs) != 0 &&
      (C.depth > 0 ? coalesce(kind, nbytes, device) : sample(kind, nbytes, device)) < 0) {
    return -1;
  }
  if (PyList_GET_SIZE(L.listeners) == 0) return 0;
  PyObject* args[] = {kind, nbytes, device};
  PyObject* r = PyObject_Vectorcall(L.notify, args, 3, nullptr);
  Py_XDECREF(r);
  return r == nullptr ? -1 : 0;
}

int free_bytes(PyObject* device, PyObject* nbytes) {
  if (coalesced_before(L.free_str) < 0) return -1;
  {
    Locked lock;
    if (!lock.ok) return -1;
    if (add_to(L.allocated, device, nbytes, true) < 0 || add_to(L.counts, L.free_str, L.one) < 0) return -1;
  }
  return tell(L.free_str, nbytes, device);
}

// The weak-reference callback of a released buffer that was still referenced (`self`: its key). It runs where
// the array dies, often under C++ frames: it never raises.
PyObject* gone(PyObject* key, PyObject* /*ref*/) {
  PyObject* entry = nullptr;
  {
    Locked lock;
    if (lock.ok) {
      entry = PyDict_GetItemWithError(L.deferred, key);
      if (entry != nullptr) {
        Py_INCREF(entry);
        if (PyDict_DelItem(L.deferred, key) < 0) Py_CLEAR(entry);
      }
    }
  }
  if (entry != nullptr) {
    free_bytes(PyList_GET_ITEM(entry, 1), PyList_GET_ITEM(entry, 2));
    Py_DECREF(entry);
  }
  PyErr_Clear();
  Py_RETURN_NONE;
}

PyMethodDef gone_def = {"_ledger_gone", &gone, METH_O, "A released buffer's array is gone: its bytes are free."};

// Whether `value` (what a storage holds) is a JAX array, as storage.is_array answers; -1 on error.
int is_array(PyObject* value) {
  if (value == Py_None) return 0;
  PyObject* known = PyDict_GetItemWithError(L.array_types, reinterpret_cast<PyObject*>(Py_TYPE(value)));
  if (known != nullptr) return known == Py_True;
  if (PyErr_Occurred()) return -1;
  PyObject* r = PyObject_CallOneArg(L.is_array, value);
  if (r == nullptr) return -1;
  int yes = PyObject_IsTrue(r);
  Py_DECREF(r);
  return yes;
}

PyObject* finalize(PyObject* self, PyObject* /*unused*/) {
  PyObject* held = L.storage_array.get(self);
  if (held == nullptr) Py_RETURN_NONE;  // __init__ never ran
  int yes = is_array(held);
  if (yes < 0 || (yes == 1 && ledger_release(held) < 0)) return nullptr;
  Py_RETURN_NONE;
}

PyMethodDef finalize_def = {"__del__", &finalize, METH_NOARGS,
                            "Release the array this storage holds to memory accounting (csrc/ledger.cpp)."};

PyObject* item(PyObject* config, const char* name) {
  PyObject* v = PyDict_GetItemString(config, name);
  if (v == nullptr) {
    PyErr_Format(PyExc_KeyError, "torchtpu_lab ledger: configure_ledger lacks %s", name);
    return nullptr;
  }
  Py_INCREF(v);
  return v;
}

}  // namespace

bool ledger_ready() { return L.ready; }

int ledger_holds(PyObject* array) {
  if (!L.ready) {
    PyErr_SetString(PyExc_RuntimeError, "torchtpu_lab: the native ledger is not configured");
    return -1;
  }
  PyObject* id = PyLong_FromVoidPtr(array);  // the key memory.py uses: id(array)
  if (id == nullptr) return -1;
  const int held = PyDict_Contains(L.live, id);
  Py_DECREF(id);
  return held;
}

int configure_ledger(PyObject* config) {
  if (L.ready) return 0;
  PyObject* lock = item(config, "lock");
  PyObject* storage = lock == nullptr ? nullptr : item(config, "Storage");
  if (storage == nullptr) {
    Py_XDECREF(lock);
    return -1;
  }
  Slot* slots[] = {&L.storage_array, &L.storage_shape, &L.storage_dtype, &L.storage_device, &L.storage_nbytes,
                   &L.storage_source};
  const char* names[] = {"_array", "shape", "dtype", "device_index", "nbytes", "source"};
  bool found = true;
  for (int i = 0; i < 6 && found; ++i) {
    *slots[i] = find_slot(storage, names[i]);
    found = slots[i]->offset >= 0;
  }
  Py_DECREF(storage);
  L.lock_acquire = !found ? nullptr : PyObject_GetAttrString(lock, "acquire");
  L.lock_release = L.lock_acquire == nullptr ? nullptr : PyObject_GetAttrString(lock, "release");
  L.native_lock = is_lock(lock) ? lock : nullptr;  // kept: memory.py keeps it for the process's life
  if (L.native_lock == nullptr) Py_DECREF(lock);
  if (L.lock_release == nullptr) return -1;
  if (!(L.live = item(config, "live")) || !(L.deferred = item(config, "deferred")) ||
      !(L.allocated = item(config, "allocated")) || !(L.peak = item(config, "peak")) ||
      !(L.since_sample = item(config, "since_sample")) || !(L.counts = item(config, "counts")) ||
      !(L.listeners = item(config, "listeners")) || !(L.notify = item(config, "notify")) ||
      !(L.array_types = item(config, "array_types")) || !(L.is_array = item(config, "is_array")) ||
      !(L.sample_logs = item(config, "sample_logs")) || !(L.peak_reached = item(config, "peak_reached"))) {
    return -1;
  }
  if (!PyList_Check(L.listeners) || !PyList_Check(L.sample_logs)) {
    PyErr_SetString(PyExc_TypeError, "torchtpu_lab ledger: listeners and sample_logs must be lists");
    return -1;
  }
  PyObject* log_type = item(config, "sample_log_type");
  if (log_type == nullptr) return -1;
  L.sample_log_type = reinterpret_cast<PyTypeObject*>(log_type);  // kept: the type outlives the ledger
  Slot* log_slots[] = {&L.log_device, &L.log_samples, &L.log_above};
  const char* log_names[] = {"device_index", "samples", "above"};
  for (int i = 0; i < 3; ++i) {
    *log_slots[i] = find_slot(log_type, log_names[i]);
    if (log_slots[i]->offset < 0) return -1;
  }
  L.alloc_str = PyUnicode_InternFromString("alloc");
  L.free_str = PyUnicode_InternFromString("free");
  L.is_deleted_str = PyUnicode_InternFromString("is_deleted");
  L.one = PyLong_FromLong(1);
  L.zero = PyLong_FromLong(0);
  if (!L.alloc_str || !L.free_str || !L.is_deleted_str || !L.one || !L.zero) return -1;
  L.ready = true;
  return 0;
}

int ledger_acquire(PyObject* array, PyObject* device, PyObject* nbytes, PyObject* origin) {
  if (coalesced_before(L.alloc_str) < 0) return -1;
  Key id(array);
  if (id.p == nullptr) return -1;
  PyObject* key = id.p;
  bool counted = false;
  {
    Locked lock;
    if (!lock.ok) return -1;
    int rc = 0;
    PyObject* entry = PyDict_GetItemWithError(L.live, key);
    if (entry != nullptr) {  // one more storage holds it
      PyObject* holders = PyNumber_Add(PyList_GET_ITEM(entry, 1), L.one);
      rc = holders == nullptr ? -1 : PyList_SetItem(entry, 1, holders);
    } else if (PyErr_Occurred()) {
      rc = -1;
    } else {
      bool again = false;  // held again before it was gone: no new bytes
      if (PyDict_GET_SIZE(L.deferred) > 0) {
        PyObject* old = PyDict_GetItemWithError(L.deferred, key);
        if (old != nullptr) {
          again = true;
          rc = PyDict_DelItem(L.deferred, key);
        } else if (PyErr_Occurred()) {
          rc = -1;
        }
      }
      PyObject* fresh = rc < 0 ? nullptr : untracked(PyList_New(5));  // see pyobjects.h
      if (fresh == nullptr) {
        rc = -1;
      } else {
        PyObject* items[] = {array, L.one, device, nbytes, origin != nullptr ? origin : Py_None};
        for (Py_ssize_t i = 0; i < 5; ++i) {
          Py_INCREF(items[i]);
          PyList_SET_ITEM(fresh, i, items[i]);
        }
        rc = PyDict_SetItem(L.live, key, fresh);
        Py_DECREF(fresh);
      }
      if (rc == 0 && !again) {
        PyObject* total = nullptr;
        rc = add_to(L.allocated, device, nbytes);
        if (rc == 0) {
          total = PyDict_GetItemWithError(L.allocated, device);  // borrowed: just set
          rc = total == nullptr ? -1 : 0;
        }
        if (rc == 0) Py_INCREF(total);
        if (rc == 0) rc = raise_to(L.peak, device, total);
        if (rc == 0) rc = raise_to(L.since_sample, device, total);
        Py_XDECREF(total);
        if (rc == 0) rc = add_to(L.counts, L.alloc_str, L.one);
        counted = rc == 0;
      }
    }
    if (rc < 0) return -1;
  }
  return counted ? tell(L.alloc_str, nbytes, device) : 0;
}

int ledger_release(PyObject* array) {
  Key id(array);
  if (id.p == nullptr) return -1;
  PyObject* key = id.p;
  PyObject* entry = nullptr;  // the released entry, when the last holder let go and its bytes are free now
  {
    Locked lock;
    if (!lock.ok) return -1;
    int rc = 0;
    PyObject* held = PyDict_GetItemWithError(L.live, key);
    if (held == nullptr) {
      rc = PyErr_Occurred() ? -1 : 0;
    } else {
      PyObject* holders = PyNumber_Subtract(PyList_GET_ITEM(held, 1), L.one);
      int more = holders == nullptr ? -1 : PyObject_RichCompareBool(holders, L.zero, Py_GT);
      if (more < 0) {
        Py_XDECREF(holders);
        rc = -1;
      } else if (more) {
        rc = PyList_SetItem(held, 1, holders);
      } else {
        Py_DECREF(holders);
        // Held by nothing but the caller (the storage's slot, or store()'s hold of what it held) and the entry
        // dropped below: it goes with them, so its bytes are free now, with no weak reference to wait on.
        int dead = 1;
        if (Py_REFCNT(array) > 2) {
          PyObject* deleted = PyObject_CallMethodNoArgs(array, L.is_deleted_str);
          dead = deleted == nullptr ? -1 : PyObject_IsTrue(deleted);
          Py_XDECREF(deleted);
        }
        PyObject* ref = nullptr;
        if (dead == 0) {  // still alive: counted until the array object is gone
          // The callback is untracked (it holds an int); the weak reference is not and must not be: the
          // collector moves it between its lists when the array is cyclic garbage (see pyobjects.h).
          PyObject* callback = untracked(PyCFunction_New(&gone_def, key));
          ref = callback == nullptr ? nullptr : PyWeakref_NewRef(array, callback);
          Py_XDECREF(callback);
          if (ref == nullptr && PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();  // not weak-referenceable: count it free now
          } else if (ref == nullptr) {
            dead = -1;
          }
        }
        if (dead < 0) {
          rc = -1;
        } else {
          Py_INCREF(held);
          rc = PyDict_DelItem(L.live, key);
          if (rc == 0 && ref != nullptr) {
            PyObject* later = untracked(PyList_New(4));
            if (later == nullptr) {
              rc = -1;
            } else {
              PyList_SET_ITEM(later, 0, ref);
              ref = nullptr;
              for (Py_ssize_t i = 1; i < 4; ++i) {
                PyObject* v = PyList_GET_ITEM(held, i + 1);
                Py_INCREF(v);
                PyList_SET_ITEM(later, i, v);
              }
              rc = PyDict_SetItem(L.deferred, key, later);
              Py_DECREF(later);
            }
            Py_DECREF(held);
          } else if (rc == 0) {
            entry = held;
          } else {
            Py_DECREF(held);
          }
        }
        Py_XDECREF(ref);
      }
    }
    if (rc < 0) {
      Py_XDECREF(entry);
      return -1;
    }
  }
  if (entry == nullptr) return 0;
  int rc = free_bytes(PyList_GET_ITEM(entry, 2), PyList_GET_ITEM(entry, 3));
  Py_DECREF(entry);
  return rc;
}

int ledger_settle() {
  if (PyDict_GET_SIZE(L.deferred) == 0) return 0;
  PyObject* items = PyDict_Items(L.deferred);  // a snapshot: frees below may run listeners
  if (items == nullptr) return -1;
  CoalescedScope coalesced;
  int rc = 0;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items) && rc == 0; ++i) {
    PyObject* key = PyTuple_GET_ITEM(PyList_GET_ITEM(items, i), 0);
    PyObject* entry = PyTuple_GET_ITEM(PyList_GET_ITEM(items, i), 1);
    PyObject* array = PyWeakref_GetObject(PyList_GET_ITEM(entry, 0));  // borrowed; None once it is gone
    int done = 1;
    if (array != Py_None) {
      Py_INCREF(array);
      PyObject* deleted = PyObject_CallMethodNoArgs(array, L.is_deleted_str);
      Py_DECREF(array);
      done = deleted == nullptr ? -1 : PyObject_IsTrue(deleted);
      Py_XDECREF(deleted);
    }
    if (done < 0) {
      rc = -1;
    } else if (done) {
      bool mine = false;  // still deferred: neither its callback nor another settle freed it meanwhile
      {
        Locked lock;
        if (!lock.ok) {
          rc = -1;
        } else if (PyDict_GetItemWithError(L.deferred, key) == entry) {
          mine = true;
          rc = PyDict_DelItem(L.deferred, key);
        } else if (PyErr_Occurred()) {
          rc = -1;
        }
      }
      if (rc == 0 && mine) rc = free_bytes(PyList_GET_ITEM(entry, 1), PyList_GET_ITEM(entry, 2));
    }
  }
  Py_DECREF(items);
  return rc < 0 ? rc : coalesced.finish();
}

int ledger_store(PyObject* storage, PyObject* value) {
  PyObject* old = L.storage_array.get(storage);
  if (value == old) return 0;
  int yes = is_array(value);
  if (yes < 0) return -1;
  if (yes) {
    PyObject* origin = untracked(PyTuple_Pack(3, L.storage_shape.get(storage), L.storage_dtype.get(storage),
                                              L.storage_source.get(storage)));
    if (origin == nullptr) return -1;
    int rc = ledger_acquire(value, L.storage_device.get(storage), L.storage_nbytes.get(storage), origin);
    Py_DECREF(origin);
    if (rc < 0) return -1;
  }
  PyObject* held = old;  // the slot's reference goes with the write; release still reads the array
  Py_XINCREF(held);
  L.storage_array.set(storage, value);
  int rc = 0;
  if (held != nullptr) {
    yes = is_array(held);
    rc = yes < 0 || (yes == 1 && ledger_release(held) < 0) ? -1 : 0;
    Py_DECREF(held);
  }
  return rc;
}

PyObject* ledger_settle_py(PyObject* /*module*/, PyObject* /*unused*/) {
  if (ledger_settle() < 0) return nullptr;
  Py_RETURN_NONE;
}

PyObject* store_all_py(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyList_Check(args[0]) || !PyList_Check(args[1]) ||
      PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[1])) {
    PyErr_SetString(PyExc_TypeError, "store_all(storages: list, values: list of the same length)");
    return nullptr;
  }
  CoalescedScope coalesced;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(args[0]); ++i) {
    if (ledger_store(PyList_GET_ITEM(args[0], i), PyList_GET_ITEM(args[1], i)) < 0) return nullptr;
  }
  if (coalesced.finish() < 0) return nullptr;
  Py_RETURN_NONE;
}

PyObject* ledger_acquire_py(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 3 || nargs > 4) {
    PyErr_SetString(PyExc_TypeError, "acquire(array, device_index, nbytes, origin=None)");
    return nullptr;
  }
  if (ledger_acquire(args[0], args[1], args[2], nargs == 4 ? args[3] : Py_None) < 0) return nullptr;
  Py_RETURN_NONE;
}

PyObject* ledger_release_py(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1) {
    PyErr_SetString(PyExc_TypeError, "release(array)");
    return nullptr;
  }
  if (ledger_release(args[0]) < 0) return nullptr;
  Py_RETURN_NONE;
}

PyObject* storage_finalizer(PyObject* storage_type) {
  if (!PyType_Check(storage_type)) {
    PyErr_SetString(PyExc_TypeError, "storage_finalizer expects the Storage class");
    return nullptr;
  }
  return PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(storage_type), &finalize_def);
}

}  // namespace torchtpu
