// A fused sync's per-call plan, in C (sync_plan.cpp): which leaf buffers the graph's executable takes as
// donations, the order of its outputs that pairs each donated buffer with the value that replaces it, and the
// commit of its results into their placeholders. runtime/fused.py's `_donate`, `_alias_order` and result loop
// say what each computes; these are the same steps on the same objects, without a Python frame per leaf.
#pragma once

#include <Python.h>

namespace torchtpu {

// donate(leaves, candidates, reusable) -> tuple: fused._donate, memory.is_held asked of the native ledger.
PyObject* donate_py(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
// alias_order(targets, leaves, leaf_sigs, donate, storages, held, prior) -> list | None: fused._alias_order.
PyObject* alias_order_py(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
// commit(targets, results): target.value = result for each pair of placeholders and arrays.
PyObject* commit_py(PyObject* module, PyObject* const* args, Py_ssize_t nargs);

}  // namespace torchtpu
