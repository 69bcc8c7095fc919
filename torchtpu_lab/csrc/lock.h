// The runtime's re-entrant lock (fused.LOCK) as a C type: threading.RLock's semantics, with an owner check and an
// uncontended acquire that the recording kernel makes as plain C calls.
//
// Why: the kernel takes fused.LOCK around every op it records or runs. Through RLock's Python methods that was
// ~200 ns an op (acquire's call builds an argument tuple and parses it; release is a second call), ~5% of a
// recorded op; the Python entry points' `with LOCK:` paid RLock's price too. Here acquire, release and the owner check are a few loads and
// stores under the GIL, plus one uncontended PyThread lock operation on the outermost acquire and release.
#pragma once

#include <Python.h>

namespace torchtpu {

// Adds the `Lock` type to `module` (-1 with a Python error set on failure).
int add_lock_type(PyObject* module);

// Whether `obj` is a Lock.
bool is_lock(PyObject* obj);

// Takes `lock` without waiting: false when another thread holds it. The caller holds the GIL.
bool lock_try_acquire(PyObject* lock);

// Releases one level of `lock`, which this thread holds (the caller checked; nothing else can fail).
void lock_release(PyObject* lock);

// Whether this thread holds `lock`.
bool lock_owned(PyObject* lock);

}  // namespace torchtpu
