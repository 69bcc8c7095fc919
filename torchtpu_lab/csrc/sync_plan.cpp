// A fused sync's per-call plan in C: fused.py's `_donate`, `_alias_order` and its results loop (sync_plan.h).
// A training step's sync walks every leaf, placeholder and storage of its graph (a tiny transformer's: 93 array
// leaves, 126 outputs) in each of them, a few dict look-ups per element: here ~55 us less a sync than in Python
// (docs/perf.md, "twenty-first pass"). Plain CPython API: no torch header, so this unit builds in a second.
#include "sync_plan.h"

#include <unordered_map>
#include <vector>

#include "ledger.h"
#include "pyobjects.h"

namespace torchtpu {
namespace {

// The `shape`, `dtype` and `value` slots of the placeholder class (fused.LazyValue), found on first use.
struct PlaceholderSlots {
  PyTypeObject* type = nullptr;
  Slot shape, dtype, value;
};
PlaceholderSlots placeholder;

bool know_placeholder(PyObject* v) {
  if (Py_TYPE(v) == placeholder.type) return true;
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(v));
  PlaceholderSlots found;
  found.shape = find_slot(type, "shape");
  if (found.shape.offset < 0) return false;
  found.dtype = find_slot(type, "dtype");
  if (found.dtype.offset < 0) return false;
  found.value = find_slot(type, "value");
  if (found.value.offset < 0) return false;
  found.type = Py_TYPE(v);
  placeholder = found;
  return true;
}

// id(obj) -> a key, as Python's id() gives it (prior's values are ids).
inline void* id_of(PyObject* obj) { return static_cast<void*>(obj); }

// `sig == (v.shape, v.dtype)` for a leaf's signature (a (shape, dtype) tuple for an array, a type for a number).
// 1, 0, or -1 with a Python error set.
int same_signature(PyObject* sig, PyObject* v) {
  if (!PyTuple_Check(sig) || PyTuple_GET_SIZE(sig) != 2) return 0;
  PyObject* shape = placeholder.shape.get(v);
  PyObject* dtype = placeholder.dtype.get(v);
  if (shape == nullptr || dtype == nullptr) {
    PyErr_SetString(PyExc_AttributeError, "torchtpu_lab: a placeholder without its shape or dtype");
    return -1;
  }
  int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(sig, 0), shape, Py_EQ);
  if (eq != 1) return eq;
  return PyObject_RichCompareBool(PyTuple_GET_ITEM(sig, 1), dtype, Py_EQ);
}

// The targets not in `paired`, by (shape, dtype), each signature's positions in recording order (fused._spare).
struct Spare {
  OwnedRef index;  // {(shape, dtype): i} into `positions`
  std::vector<std::vector<Py_ssize_t>> positions;
  std::vector<size_t> next;

  bool build(PyObject* targets, const std::vector<bool>& paired) {
    index.p = PyDict_New();
    if (index.p == nullptr) return false;
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(targets); ++j) {
      if (paired[j]) continue;
      PyObject* v = PyList_GET_ITEM(targets, j);
      OwnedRef sig(PyTuple_Pack(2, placeholder.shape.get(v), placeholder.dtype.get(v)));
      if (sig.p == nullptr) return false;
      PyObject* at = PyDict_GetItemWithError(index.p, sig.p);
      if (at == nullptr) {
        if (PyErr_Occurred()) return false;
        OwnedRef slot(PyLong_FromSize_t(positions.size()));
        if (slot.p == nullptr || PyDict_SetItem(index.p, sig.p, slot.p) < 0) return false;
        positions.emplace_back();
        next.push_back(0);
        positions.back().push_back(j);
      } else {
        positions[PyLong_AsSize_t(at)].push_back(j);
      }
    }
    return true;
  }

  // The next spare position of signature `sig` (-1: none left); -2 with a Python error set.
  Py_ssize_t take(PyObject* sig) {
    PyObject* at = PyDict_GetItemWithError(index.p, sig);
    if (at == nullptr) return PyErr_Occurred() ? -2 : -1;
    const size_t k = PyLong_AsSize_t(at);
    if (next[k] >= positions[k].size()) return -1;
    return positions[k][next[k]++];
  }
};

}  // namespace

PyObject* donate_py(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyList_Check(args[0]) || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, "donate(leaves: list, candidates: tuple, reusable: tuple)");
    return nullptr;
  }
  PyObject* leaves = args[0];
  PyObject* candidates = args[1];
  std::vector<long> left;
  left.reserve(PyTuple_GET_SIZE(args[2]));
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(args[2]); ++k) {
    left.push_back(PyLong_AsLong(PyTuple_GET_ITEM(args[2], k)));
  }
  if (PyErr_Occurred()) return nullptr;
  OwnedRef donate(PyList_New(0));
  if (donate.p == nullptr) return nullptr;
  for (Py_ssize_t c = 0; c < PyTuple_GET_SIZE(candidates); ++c) {
    PyObject* pair = PyTuple_GET_ITEM(candidates, c);
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
      PyErr_SetString(PyExc_TypeError, "donate: each candidate is a (leaf position, signature slot) pair");
      return nullptr;
    }
    const Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
    const Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 1));
    if (PyErr_Occurred()) return nullptr;
    if (i < 0 || i >= PyList_GET_SIZE(leaves) || k < 0 || k >= static_cast<Py_ssize_t>(left.size())) {
      PyErr_SetString(PyExc_IndexError, "donate: a candidate outside the leaves or signatures");
      return nullptr;
    }
    if (left[k] == 0) continue;
    const int held = ledger_holds(PyList_GET_ITEM(leaves, i));  // memory.is_held
    if (held < 0) return nullptr;
    if (held) continue;
    --left[k];
    if (PyList_Append(donate.p, PyTuple_GET_ITEM(pair, 0)) < 0) return nullptr;
  }
  return PyList_AsTuple(donate.p);
}

PyObject* alias_order_py(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 7 || !PyList_Check(args[0]) || !PyList_Check(args[1]) || !PyTuple_Check(args[2]) ||
      !PyTuple_Check(args[3]) || !PyList_Check(args[4]) || !PyList_Check(args[5]) || !PyDict_Check(args[6])) {
    PyErr_SetString(PyExc_TypeError, "alias_order(targets: list, leaves: list, leaf_sigs: tuple, donate: tuple, "
                                     "storages: list, held: list, prior: dict)");
    return nullptr;
  }
  PyObject* targets = args[0];
  PyObject* leaves = args[1];
  PyObject* leaf_sigs = args[2];
  PyObject* donate = args[3];
  PyObject* storages = args[4];
  PyObject* held = args[5];
  PyObject* prior = args[6];
  if (PyTuple_GET_SIZE(donate) == 0 || PyDict_GET_SIZE(prior) == 0) Py_RETURN_NONE;
  const Py_ssize_t n_targets = PyList_GET_SIZE(targets);
  if (n_targets > 0 && !know_placeholder(PyList_GET_ITEM(targets, 0))) return nullptr;

  std::vector<Py_ssize_t> donated_at;  // donate's leaf positions, in order
  std::unordered_map<void*, Py_ssize_t> donated;  // id(leaf) -> its position
  for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(donate); ++d) {
    const Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(donate, d));
    if (PyErr_Occurred()) return nullptr;
    if (i < 0 || i >= PyList_GET_SIZE(leaves) || i >= PyTuple_GET_SIZE(leaf_sigs)) {
      PyErr_SetString(PyExc_IndexError, "alias_order: a donated position outside the leaves");
      return nullptr;
    }
    donated_at.push_back(i);
    donated[id_of(PyList_GET_ITEM(leaves, i))] = i;  // the last of equal ids, as a dict comprehension keeps
  }
  std::unordered_map<void*, Py_ssize_t> position;  // id(target) -> its position
  position.reserve(n_targets);
  for (Py_ssize_t j = 0; j < n_targets; ++j) {
    PyObject* v = PyList_GET_ITEM(targets, j);
    if (Py_TYPE(v) != placeholder.type) {
      PyErr_SetString(PyExc_TypeError, "alias_order: targets must be placeholders of one class");
      return nullptr;
    }
    position[id_of(v)] = j;
  }

  std::unordered_map<Py_ssize_t, Py_ssize_t> update;  // donated leaf position -> the target that replaces it
  const Py_ssize_t n_pairs = std::min(PyList_GET_SIZE(storages), PyList_GET_SIZE(held));
  for (Py_ssize_t p = 0; p < n_pairs; ++p) {
    OwnedRef key(PyLong_FromVoidPtr(id_of(PyList_GET_ITEM(storages, p))));
    if (key.p == nullptr) return nullptr;
    PyObject* old = PyDict_GetItemWithError(prior, key.p);  // id of the array the storage held before
    if (old == nullptr) {
      if (PyErr_Occurred()) return nullptr;
      continue;
    }
    void* old_id = PyLong_AsVoidPtr(old);
    if (old_id == nullptr && PyErr_Occurred()) return nullptr;
    const auto leaf = donated.find(old_id);
    if (leaf == donated.end() || update.count(leaf->second)) continue;
    PyObject* v = PyList_GET_ITEM(held, p);
    if (Py_TYPE(v) != placeholder.type) {
      PyErr_SetString(PyExc_TypeError, "alias_order: held values must be placeholders of one class");
      return nullptr;
    }
    const int same = same_signature(PyTuple_GET_ITEM(leaf_sigs, leaf->second), v);
    if (same < 0) return nullptr;
    if (!same) continue;
    const auto at = position.find(id_of(v));
    if (at == position.end()) {
      PyErr_SetString(PyExc_KeyError, "alias_order: a held placeholder that is not a target");
      return nullptr;
    }
    update[leaf->second] = at->second;
  }
  if (update.empty()) Py_RETURN_NONE;

  std::vector<bool> paired(n_targets, false);
  for (const auto& kv : update) paired[kv.second] = true;
  Spare spare;
  bool spare_built = false;
  std::vector<Py_ssize_t> first;
  for (Py_ssize_t i : donated_at) {
    Py_ssize_t j = -1;
    const auto up = update.find(i);
    if (up != update.end()) {
      j = up->second;
    } else {
      if (!spare_built) {
        if (!spare.build(targets, paired)) return nullptr;
        spare_built = true;
      }
      j = spare.take(PyTuple_GET_ITEM(leaf_sigs, i));
      if (j == -2) return nullptr;
    }
    if (j >= 0) first.push_back(j);
  }
  std::vector<bool> taken(n_targets, false);
  for (Py_ssize_t j : first) taken[j] = true;
  OwnedRef order(PyList_New(0));
  if (order.p == nullptr) return nullptr;
  auto append = [&](Py_ssize_t j) {
    OwnedRef item(PyLong_FromSsize_t(j));
    return item.p != nullptr && PyList_Append(order.p, item.p) == 0;
  };
  for (Py_ssize_t j : first) {
    if (!append(j)) return nullptr;
  }
  for (Py_ssize_t j = 0; j < n_targets; ++j) {
    if (!taken[j] && !append(j)) return nullptr;
  }
  return order.release();
}

PyObject* commit_py(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyList_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "commit(targets: list, results: sequence)");
    return nullptr;
  }
  PyObject* targets = args[0];
  OwnedRef results(PySequence_Fast(args[1], "commit: results must be a sequence"));
  if (results.p == nullptr) return nullptr;
  const Py_ssize_t n = std::min(PyList_GET_SIZE(targets), PySequence_Fast_GET_SIZE(results.p));
  for (Py_ssize_t j = 0; j < n; ++j) {
    PyObject* v = PyList_GET_ITEM(targets, j);
    PyObject* r = PySequence_Fast_GET_ITEM(results.p, j);
    if (Py_TYPE(v) == placeholder.type || know_placeholder(v)) {
      placeholder.value.set(v, r);
    } else {
      PyErr_Clear();
      if (PyObject_SetAttrString(v, "value", r) < 0) return nullptr;
    }
  }
  Py_RETURN_NONE;
}

}  // namespace torchtpu
