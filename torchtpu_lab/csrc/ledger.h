// The device-memory ledger's hot half (ledger.cpp): device/memory.py's acquire, release and settle,
// Storage.__del__, and a sync's commit (store_all).
#pragma once

#include <Python.h>

namespace torchtpu {

// Hands the ledger memory.py's own state, by name in a dict (the dicts it counts in, its lock, its listeners and
// their notifier, storage.py's array test); once, at registration. Returns 0, or -1 with a Python error set.
int configure_ledger(PyObject* config);
bool ledger_ready();

// memory.acquire(array, device_index, nbytes, origin) / memory.release(array), on the same dicts under the same
// lock. Return 0, or -1 with a Python error set (a listener's notifier or the lock failed).
int ledger_acquire(PyObject* array, PyObject* device_index, PyObject* nbytes, PyObject* origin);
int ledger_release(PyObject* array);
// memory.settle(): released buffers whose arrays are gone or deleted (donated to a program that ran) are free.
int ledger_settle();
// storage.array = value, the Storage.array setter's steps: the new array acquired (with the storage's shape,
// dtype and source as its origin), the slot written, the old array released. 0, or -1 with a Python error set.
int ledger_store(PyObject* storage, PyObject* value);
// memory.is_held(array): whether some live storage holds it. 1, 0, or -1 with a Python error set (also before
// configure_ledger).
int ledger_holds(PyObject* array);

// The Python faces: acquire/release as METH_FASTCALL functions, and the finalizer method descriptor for
// `storage_type` (Storage.__del__: releases the array its `_array` slot holds).
PyObject* ledger_acquire_py(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
PyObject* ledger_release_py(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
PyObject* ledger_settle_py(PyObject* module, PyObject* unused);
// store_all(storages, values): `storage.array = value` for each pair (a sync's commit), the setter's steps.
PyObject* store_all_py(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
PyObject* storage_finalizer(PyObject* storage_type);

}  // namespace torchtpu
