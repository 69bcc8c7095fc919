// The recording kernel: fused eager mode's common op recorded into the pending graph without entering Python.
//
// Every lowered op's PrivateUse1 kernel is a `RecordingKernel`. A call it has seen before — the same op on base
// tpu tensors of the same shapes and dtypes, with the same other arguments — is recorded here exactly as
// runtime/executor.py's `_record_single` records it: a `Node` and its `LazyValue` placeholder appended to
// `fused.PENDING` (its graph-key segment, cut-point tail and storage tracking included), a `Storage` around the
// placeholder and the output tensor, the user's line read from the current frame. These are the same Python
// objects the Python path makes, so the sync, the cause analysis and the lab read one pending graph whichever
// path recorded an op. An op with checks (an index bound) is recorded with its error flags as further outputs
// of its node, which the next sync computes and hands to pending_errors, as the Python path does. Everything
// else — a first call, debug mode, a pending interrupt, another thread inside the runtime,
// config.native_recording off — goes to the op's Python kernel, which on a recordable call teaches this table
// its entry (`learn`). While a profile records,
// the op's line, stack and op record come from telemetry's own functions (Python, but no kernel).
//
// Strict mode (`try_run`): a call seen before, under the same key, runs the op's cached executable from here —
// JAX's C++ call of the compiled executable, on the arguments' arrays — and its output array becomes a
// Storage (memory.acquire, as Storage.output) and a tensor, with op_cache_hits counted, as
// executor._run_repeated does; an in-place update of a base tensor (an optimizer's) writes it into self's
// storage (values.set_array). The Python path teaches it (`learn_strict`). Pending fused work, another device,
// a TypeError from the executable (a weak type: jit decides) take the Python path; under a profile the call's
// op record and entry span are noted here.
//
// The kernel never runs Python that can raise on the recorded path (no bytecode runs there at all); the
// Python kernel it falls back to, the graph-size flush, and strict mode's executable and memory accounting
// may raise, as any kernel may: the error (the same Python exception the Python path raises) reaches the
// caller through the dispatcher, with fused.LOCK released.
#include "recorder.h"
#include "pyobjects.h"

#include <Python.h>
#include <descrobject.h>
#include <frameobject.h>
#include <structmember.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <ATen/Context.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include "device.h"
#include "geometry.h"
#include "ledger.h"
#include "lock.h"
#include "op_log.h"
#include "tensor_factory.h"

namespace torchtpu {
namespace {

// ---- the fallback: one of our Python kernels called from the boxed kernel ----
//
// PyTorch gives a Python kernel (torch.library) its arguments as: positional arguments up to the first
// keyword-only one, less a tail of positional arguments equal to their defaults; keyword-only arguments as
// keywords, less those equal to their defaults; dtypes, layouts and memory formats as their Python objects
// (wrapped scalars as Python numbers). Our kernels and their cache keys were written against that, so the
// fallback gives them the same. (In this unit rather than one of its own: it needs the same heavy PyTorch
// headers, and each unit costs the 2-core build a minute or more.)


bool is_kind(const c10::Argument& arg, c10::TypeKind kind) {
  const auto& t = arg.real_type();
  if (t->kind() == kind) return true;
  auto opt = t->cast<c10::OptionalType>();
  return opt && opt->getElementType()->kind() == kind;
}

PyObject* to_python(const c10::Argument& arg, const c10::IValue& v) {
  if (v.isNone()) Py_RETURN_NONE;
  if (is_kind(arg, c10::ScalarTypeType::Kind)) {
    return Py_NewRef(reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<c10::ScalarType>(v.toInt()))));
  }
  if (is_kind(arg, c10::LayoutType::Kind)) {
    return Py_NewRef(reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<c10::Layout>(v.toInt()))));
  }
  if (is_kind(arg, c10::MemoryFormatType::Kind)) {
    return Py_NewRef(torch::utils::getTHPMemoryFormat(static_cast<c10::MemoryFormat>(v.toInt())));
  }
  return torch::jit::toPyObject(v).release().ptr();
}

bool is_default(const c10::Argument& arg, const c10::IValue& v) {
  return arg.default_value().has_value() && *arg.default_value() == v;
}


}  // namespace

// Pops the op's arguments off `stack`, calls `fn(*args, **kwargs)` and pushes its results; the GIL is held.
void call_python_kernel(PyObject* fn, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto& formals = schema.arguments();
  const size_t n = formals.size();
  auto actuals = torch::jit::last(*stack, n);

  size_t kwarg_only = n;
  while (kwarg_only > 0 && formals[kwarg_only - 1].kwarg_only()) --kwarg_only;
  size_t positional = kwarg_only;
  while (positional > 0 && is_default(formals[positional - 1], actuals[positional - 1])) --positional;

  PyObject* args = PyTuple_New(static_cast<Py_ssize_t>(positional));
  if (args == nullptr) throw python_error();
  PyObject* kwargs = nullptr;
  PyObject* out = nullptr;
  try {
    for (size_t i = 0; i < positional; ++i) PyTuple_SET_ITEM(args, i, to_python(formals[i], actuals[i]));
    for (size_t i = kwarg_only; i < n; ++i) {
      if (is_default(formals[i], actuals[i])) continue;
      if (kwargs == nullptr && (kwargs = PyDict_New()) == nullptr) throw python_error();
      PyObject* value = to_python(formals[i], actuals[i]);
      int rc = PyDict_SetItemString(kwargs, formals[i].name().c_str(), value);
      Py_DECREF(value);
      if (rc < 0) throw python_error();
    }
    torch::jit::drop(*stack, n);
    out = PyObject_Call(fn, args, kwargs);
    if (out == nullptr) throw python_error();
    const auto& returns = schema.returns();
    if (returns.size() == 1) {
      torch::jit::push(stack, torch::jit::toIValue(out, returns[0].real_type()));
    } else if (!returns.empty()) {
      py::sequence seq = py::reinterpret_borrow<py::sequence>(out);
      TORCH_CHECK(static_cast<size_t>(seq.size()) == returns.size(), op.operator_name(), " returned ",
                  seq.size(), " values, its schema says ", returns.size());
      for (size_t i = 0; i < returns.size(); ++i) {
        torch::jit::push(stack, torch::jit::toIValue(seq[i], returns[i].real_type()));
      }
    }
  } catch (...) {
    Py_DECREF(args);
    Py_XDECREF(kwargs);
    Py_XDECREF(out);
    throw;
  }
  Py_DECREF(args);
  Py_XDECREF(kwargs);
  Py_DECREF(out);
}

namespace {

// ---- Python objects the recorded path reads (set once by configure) ----

struct Runtime {
  bool ready = false;
  PyObject* enabled = nullptr;         // config.native_recording (a State: .value)
  PyObject* mode = nullptr;            // config.eager_mode
  PyObject* track_sources = nullptr;   // config.track_sources
  PyObject* track_alloc = nullptr;     // memory.TRACK_SOURCES
  PyObject* max_ops = nullptr;         // config.max_graph_ops
  PyObject* recorders = nullptr;       // telemetry.recorders (list)
  PyObject* entry_spans = nullptr;     // interrupts.entry_spans ([None] unless a profile times entry points)
  PyObject* after_entry = nullptr;     // interrupts.after_entry: run after each op a profile records
  PyObject* interrupt = nullptr;       // interrupts._pending ([bool])
  PyObject* lock = nullptr;            // fused.LOCK (lock.h's Lock)
  PyObject* op_sources = nullptr;      // telemetry.op_sources (while a profile records)
  PyObject* adopt = nullptr;           // tensor.adopt: a plain tpu torch.Tensor (a saved output) made a TpuTensor
  PyObject* parameter_type = nullptr;  // torch.nn.Parameter (adopt handles it too)
  PyObject* set_array = nullptr;       // values.set_array(storage, placeholder): an in-place op's write
  PyObject* acquire = nullptr;         // memory.acquire(array, device, nbytes, origin): a strict output's bytes
  PyObject* release = nullptr;         // memory.release(array): an in-place write's old array
  PyObject* partial = nullptr;         // functools.partial, and pending_errors.note_later: an op's flags noted
  PyObject* note_later = nullptr;      // once a sync computed them (pending_errors.callback's partial)
  PyObject* from_host = nullptr;       // core_kernels.from_host(cpu tensor, device index): a host copy
  PyObject* counters = nullptr;        // telemetry.counters (a defaultdict(float))
  PyObject* hits_key = nullptr;        // "op_cache_hits"
  PyObject* pending = nullptr;         // fused.PENDING
  PyObject* cuts = nullptr;            // fused.CUTS
  PyObject* flush = nullptr;           // fused.flush_if_over_limit()
  PyObject* internal_files = nullptr;  // telemetry._internal_files: co_filename -> bool (skip)
  PyObject* sources = nullptr;         // telemetry._sources: (filename, line, function) -> Source
  PyObject* backward = nullptr;        // telemetry.BACKWARD
  PyObject* grown_ids = nullptr;       // growth._GROWN_IDS: id(storage) -> (dim, weak ref, lineage)
  PyObject* appended = nullptr;        // growth.appended(result, old, dim, length, k, sources): its marks
  PyObject* mark_grown = nullptr;      // growth.mark_grown(result, dim, source): a result on fronts marked
  PyObject* bounded_active = nullptr;  // bounded._ACTIVE: [True while a rewrite runs its inner ops]
  PyObject* bounded_native = nullptr;  // bounded.NATIVE: [True: the rewrites of one inner call are made here]
  PyObject* lengths = nullptr;         // growth._LENGTHS: length -> (capacity, weak ref, syncs then)
  long recent_syncs = 0;               // growth.RECENT_SYNCS
  long min_capacity = 0;               // growth.MIN_CAPACITY
  PyObject* syncs_key = nullptr;       // "syncs"
  PyTypeObject* view_type = nullptr;   // views.View (a NamedTuple: size, stride, offset, cast)
  unsigned long main_thread = 0;
  PyTypeObject* node_type = nullptr;
  PyTypeObject* lazy_type = nullptr;
  PyTypeObject* storage_type = nullptr;
  PyTypeObject* tensor_type = nullptr;
  PyTypeObject* array_type = nullptr;  // jax's concrete array class
  PyObject* fused_str = nullptr;       // "fused", "strict"
  PyObject* strict_str = nullptr;
  PyObject* one = nullptr;             // 0, -1, False: constants for new objects' slots
  PyObject* zero = nullptr;
  PyObject* minus_one = nullptr;
  Slot state_value;
  Slot pw_storages, pw_prior, pw_recorded, pw_seq, pw_segment, pw_device, pw_extra;
  Slot seg_token, seg_refs, seg_node_keys, seg_leaves, seg_leaf_sigs, seg_leaf_pos, seg_regular, seg_expect,
      seg_matching, seg_plans, seg_fallback;
  Slot cut_tail, cut_last_ids;
  Slot n_key, n_uid, n_fn, n_inputs, n_treedef, n_avals, n_name, n_source, n_seq, n_segment, n_position;
  Slot lv_node, lv_index, lv_shape, lv_dtype, lv_value;
  Slot st_array, st_shape, st_dtype, st_device, st_nbytes, st_source;
  PyObject* s_tpu_storage = nullptr;
  PyObject* s_tpu_view = nullptr;
  PyObject* s_shape = nullptr;
  PyObject* s_dtype = nullptr;
  PyObject* s_append = nullptr;
};

Runtime rt;

struct Stats {
  uint64_t recorded = 0;  // calls recorded here
  uint64_t python = 0;    // calls handed to the Python kernel
  uint64_t learned = 0;   // entries taught by the Python path
  uint64_t ran = 0;       // strict calls whose executable ran here
} stats;

Slot slot_of(PyObject* type, const char* name) {
  Slot s = find_slot(type, name);
  if (s.offset < 0) throw python_error();
  return s;
}

PyObject* item(PyObject* dict, const char* name) {
  PyObject* v = PyDict_GetItemString(dict, name);  // borrowed
  TORCH_CHECK(v != nullptr, "torchtpu_lab recorder: configure() needs ", name);
  Py_INCREF(v);  // kept for the process's life
  return v;
}

// ---- the learned calls ----

// A dynamic input of a recorded call: the array of the tensor at a stack position (or of element `element` of
// the tensor list there: torch.cat's), the Python number at one, or a constant the Python path made, fixed by
// the key (a host scalar's device array, a view's offset).
struct Source {
  int position;        // argument index, -1 for `constant`, kLength for a length-free call's length n
  PyObject* constant;  // owned
  int element = -1;    // for a tensor list argument: the element's index
};

constexpr int kLength = -2;

// A call keyed without a length (the kernel's `unsized` table): an append into spare capacity (its x's n), or
// attention over keys and values padded to a capacity (their n). Either way n is an input of the call's node.
enum class Unsized : char { kNo = 0, kAppend = 1, kAttention = 2 };

// One output of a recorded op: its shape tuple and JAX dtype (the placeholder's), torch dtype, bytes, and the
// sizes and strides its tensor reports.
struct Output {
  bool absent = false;  // an output the call's mask left out (a backward's): None, an undefined tensor
  PyObject* shape = nullptr;
  PyObject* aval_dtype = nullptr;
  PyObject* dtype = nullptr;
  PyObject* nbytes = nullptr;
  c10::ScalarType scalar_type = c10::ScalarType::Undefined;
  std::vector<int64_t> sizes, strides;
  // an output laid out as CPU lays it out (runtime/layouts.py): the View its tensor is of a storage holding its
  // elements in memory order (`shape` is that storage's), whose size and stride are `sizes` and `strides`
  PyObject* layout = nullptr;
};

// A learned call: its first (usually only) output is the Entry's own; an op with several outputs (layer norm's
// output, mean and rstd) has the others in `more`. An op with checks (an index bound) has its error flags as
// the node's leaves after the outputs (`flags`: only their shapes and JAX dtypes) and its Check list (`checks`).
struct Entry : Output {
  std::vector<Output> more;
  std::vector<Output> flags;
  PyObject* checks = nullptr;
  PyObject* compiled = nullptr;   // the executor's OpExecutable (kept alive)
  PyObject* signature = nullptr;  // its fields the node and output need, read once
  PyObject* run = nullptr;
  PyObject* avals = nullptr;
  PyObject* treedef = nullptr;
  PyObject* name = nullptr;
  PyObject* uid = nullptr;
  PyObject* fn_id = nullptr;      // id(run): the cut points' token
  std::vector<Source> dyn;
  // a strict entry's executable: what `run_now` calls (JAX's C++ call of the compiled executable), and its device
  PyObject* call = nullptr;
  long exec_device = -1;
  // a view op's entry: the output's View (or None: the whole base) and the geometry its TensorImpl reports
  PyObject* view = nullptr;
  bool reported = false;
  std::vector<int64_t> view_stride;
  int64_t view_offset = 0;
  // a view op with a list of outputs (split, split_with_sizes, unbind): one view entry per output, in order
  std::vector<std::unique_ptr<Entry>> parts;
  bool several_views = false;
  // an output laid out in another order than row-major (Output::layout): only the plain recording of its op
  // makes such tensors (output_tensor); a write of its result into `self`, its result on fronts or appended, and
  // a foreach update take the Python path
  bool laid_out = false;
};

using Table = std::unordered_map<std::string, std::unique_ptr<Entry>>;
constexpr size_t kMaxEntriesPerOp = 1024;  // a loop over ever-new scalar values must not grow it without bound

class RecordingKernel;

// The call the Python kernel is running for a kernel that missed: what `learn` files its entry under.
struct Miss {
  RecordingKernel* kernel;
  std::string key;
  Unsized unsized = Unsized::kNo;  // a length-free key (as_append, as_padded_attention): only its lesson files it
};
thread_local std::vector<Miss> misses;
// The key of the call being looked at and its tensors' arrays: per thread (a kernel object serves every thread).
thread_local std::string key_scratch;
thread_local std::vector<PyObject*> arrays_scratch;
thread_local std::vector<PyObject*> storages_scratch;  // the tensors' Storage objects (borrowed)
thread_local std::vector<char> views_scratch;          // whether each tensor argument is a view
thread_local std::vector<PyObject*> elements_scratch;  // the arrays of tensor list elements, every list in turn
thread_local std::vector<PyObject*> element_storages;  // ... their Storage objects (borrowed: the tensors hold them)
thread_local std::vector<char> element_views;          // ... whether each is a view
thread_local std::vector<int> element_start;           // per argument: where its list's arrays start there
thread_local bool factory_scratch = false;             // the call build_key keyed has no tensor argument
thread_local bool self_base_scratch = false;           // `self` keyed as its storage (a whole view, see below)
thread_local bool self_reshaped_scratch = false;       // ... a reshape of it other than dropped leading size-1 dims
thread_local std::vector<int64_t> self_base_sizes;     // that storage's shape
thread_local std::vector<int64_t> self_shape_scratch;  // and `self`'s own
// `torch.cat([x, piece], d)` as runtime/growth.py's append into spare capacity: x the first n positions along d
// of a storage grown along d, piece k more positions that still fit. Its key (as_append) leaves n out: one entry
// serves every length, n being an input of the append's program (Source kLength).
struct Append {
  bool active = false;
  PyObject* storage = nullptr;  // x's Storage (borrowed: x, on the stack, holds it)
  int64_t d = 0, n = 0, k = 0;
};
thread_local Append append_scratch;
// `scaled_dot_product_attention(q, k, v)` as runtime/padded_attention.py runs it on padded keys: k and v the first
// n positions along dim 2 of storages grown by appends. Its key (as_padded_attention) leaves n out, an input of the
// attention's program (Source kLength).
struct PaddedAttention {
  bool active = false;
  int64_t n = 0;
};
thread_local PaddedAttention padded_scratch;
// A tensor argument read whole where it is the front of a padded storage (growth.front): its geometry with
// `capacity` positions along its dim `dim`, which holds `length` (bounded.whole's view); inactive for the others.
struct Whole {
  bool active = false;
  int64_t dim = 0, length = 0, capacity = 0, offset = 0;
  std::vector<int64_t> sizes, strides;
  PyObject* storage = nullptr;  // the padded Storage (borrowed: the tensor holds it)
};
thread_local std::vector<Whole> wholes_scratch;  // per argument of the call as_pointwise_fronts looks at
// A pointwise op on fronts as runtime/bounded.py's _pointwise runs it: on the whole extents, its result the front
// of length n along dim d of the padded output.
struct OnFronts {
  bool active = false;
  int64_t d = 0, n = 0;
  PyObject* source = nullptr;  // a reordered front's Storage, whose sequence the result continues (borrowed)
};
thread_local OnFronts fronts_scratch;
thread_local std::string fronts_key_scratch;
std::vector<RecordingKernel*> kernels;  // every kernel made (for clear and stats); they live forever

// Key bytes: a tag per argument and its value. Tensors: dtype, device, sizes (base tensors only).
enum Tag : char { kTensor = 'T', kView = 'V', kWrapped = 'W', kInt = 'i', kDouble = 'd', kBool = 'b', kNone = 'n',
                  kInts = 'L', kBools = 'B', kString = 's', kDevice = 'D', kTensors = 'X', kOptionalTensors = 'O',
                  kNumbers = 'N', kCast = 'C' };

template <typename T>
void put(std::string& key, T v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// A storage's shape (a tuple of ints) into a key: its rank, then each size.
void put_shape(std::string& key, PyObject* shape) {
  const Py_ssize_t n = PyTuple_GET_SIZE(shape);
  put(key, static_cast<int8_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) put(key, static_cast<int64_t>(PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i))));
}

long as_long(PyObject* v) {
  long x = PyLong_AsLong(v);
  if (x == -1 && PyErr_Occurred()) throw python_error();
  return x;
}

// What the Python path's tensor.adopt does to a call's plain tpu tensors (a tensor autograd saved as an op's
// output comes back as a new torch.Tensor over the same storage every step: a relu_'s result for
// threshold_backward, tanh's, log_softmax's): made TpuTensors, so the key below sees them. Python, so it runs
// before the key is built (which must meet no bytecode); false where adopt raised (a Python error is set).
bool adopt_plain(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const size_t n = op.schema().arguments().size();
  for (size_t i = stack.size() - n; i < stack.size(); ++i) {
    if (!stack[i].isTensor()) continue;
    const at::Tensor& t = stack[i].toTensor();
    if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) continue;
    OwnedRef obj(THPVariable_Wrap(t));
    if (obj.p == nullptr) return false;
    PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(obj.p));
    if (type != THPVariableClass && type != rt.parameter_type) continue;
    OwnedRef adopted(PyObject_CallOneArg(rt.adopt, obj.p));
    if (adopted.p == nullptr) return false;
  }
  return true;
}

// Whether a View reads its storage as another dtype (its `cast`, views.View's fourth field, is set): the
// executable reinterprets the storage's bytes (device/reinterpret.py), so the key names the storage's dtype, and
// such a view is never keyed as its storage, nor a front of a grown one.
bool casts(PyObject* view) {
  return view != Py_None && PyTuple_GET_SIZE(view) > 3 && PyTuple_GET_ITEM(view, 3) != Py_None;
}

// A casting View's dtypes (its cast: the storage's, `which` 0, and its own, 1; torch.dtype objects).
c10::ScalarType cast_dtype(PyObject* view, Py_ssize_t which) {
  return reinterpret_cast<THPDtype*>(PyTuple_GET_ITEM(PyTuple_GET_ITEM(view, 3), which))->scalar_type;
}

int8_t cast_source(PyObject* view) { return static_cast<int8_t>(cast_dtype(view, 0)); }

// Whether `t` (a view) reads every element of a storage of shape `base` in its order: the storage in another
// shape (views.reshapes_base).
bool reshapes_storage(const at::Tensor& t, PyObject* base) {
  if (t.storage_offset() != 0) return false;
  int64_t total = 1;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(base); ++i) total *= PyLong_AsLongLong(PyTuple_GET_ITEM(base, i));
  if (t.numel() != total) return false;
  int64_t expected = 1;  // row-major strides (a size-1 dim's stride addresses nothing)
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    if (t.size(d) != 1 && t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return true;
}

// Whether `t`'s shape is `base` with leading size-1 dims left out: `[1, n]` seen as `[n]`, how PyTorch's
// `sum_to_size` hands a bias its gradient. For a view that reshapes_storage, a pointwise op on it is the same op on
// the storage, its operands broadcasting alike (views.drops_leading_ones).
bool drops_leading_ones(const at::Tensor& t, PyObject* base) {
  const Py_ssize_t n = PyTuple_GET_SIZE(base);
  const int64_t lead = static_cast<int64_t>(n) - t.dim();
  if (lead < 0) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    const long long b = PyLong_AsLongLong(PyTuple_GET_ITEM(base, i));
    if (b != (i < lead ? 1 : t.size(i - lead))) return false;
  }
  return true;
}

// Whether `t`, a whole view of a storage of shape `base`, is an operand alike for an in-place `self` keyed as its
// storage (self_base_*): `self`'s shape over a storage of `self`'s storage's shape.
// Whether a storage's shape (a tuple of ints) is `sizes`.
bool same_sizes(PyObject* shape, const std::vector<int64_t>& sizes) {
  if (PyTuple_GET_SIZE(shape) != static_cast<Py_ssize_t>(sizes.size())) return false;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (PyLong_AsLongLong(PyTuple_GET_ITEM(shape, static_cast<Py_ssize_t>(i))) != sizes[i]) return false;
  }
  return true;
}

bool alike_storage(const at::Tensor& t, PyObject* base) {
  return t.sizes() == c10::IntArrayRef(self_shape_scratch) && same_sizes(base, self_base_sizes);
}

// How tensor_input keys a view as its storage (a base tensor of the storage's shape): an in-place pointwise op's
// `self` that is all of its storage in another shape (noted in self_base_*), and, where that is not just leading
// size-1 dims dropped, each other tensor operand, which must then be the same reshape of a storage alike
// (mutation._whole_storage: the op runs on the storages); and an element of a foreach update's `self` list that is
// all of its storage without its leading size-1 dims, as its storage (foreach_kernels._whole: the element's update
// runs on the storage, its operands broadcasting alike).
enum class AsBase { kNo, kSelf, kAlike, kElement };

// Appends a tpu tensor's key (dtype, sizes; for a view also its strides, offset and its storage's shape) and
// returns the array its storage holds (borrowed), or nullptr when the recorded path cannot take it (not a
// TpuTensor object yet, an empty or failed storage, another device than the pending graph's).
// `as_base` (AsBase): kSelf keys a view that is all of its storage in another shape as that storage and notes the
// storage's shape in self_base_sizes (an in-place pointwise op's `self`, recorded on its storage); kAlike keys a
// view of self's shape that is the same reshape of a storage of that shape as that storage, and refuses (nullptr)
// any other tensor.
PyObject* tensor_input(const at::Tensor& t, long pending_device, std::string& key, PyObject** storage_out,
                       char* view_out, AsBase as_base = AsBase::kNo, const Whole* whole = nullptr) {
  if (t.device().index() != pending_device) return nullptr;
  PyObject* obj = THPVariable_Wrap(t);
  if (obj == nullptr) throw python_error();
  PyObject* array = nullptr;
  if (Py_TYPE(obj) == rt.tensor_type) {
    PyObject* view = nullptr;
    PyObject* storage = nullptr;
    if (data_in_storage(rt.tensor_type)) {  // the attributes' own source, without their descriptors
      if (data_ref(t, &storage, &view)) {
        Py_INCREF(storage);
        Py_INCREF(view);
      }
    } else {
      view = PyObject_GetAttr(obj, rt.s_tpu_view);
      storage = view == nullptr ? nullptr : PyObject_GetAttr(obj, rt.s_tpu_storage);
      if (storage == nullptr) PyErr_Clear();
    }
    PyObject* held = storage != nullptr && Py_TYPE(storage) == rt.storage_type ? rt.st_array.get(storage) : nullptr;
    if (held != nullptr && (Py_TYPE(held) == rt.lazy_type || Py_TYPE(held) == rt.array_type)) {
      array = held;  // the storage (owned by the tensor) keeps it alive for this call
      *storage_out = storage;
      PyObject* base = rt.st_shape.get(storage);
      const bool whole_view = as_base != AsBase::kNo && view != Py_None && !casts(view) && reshapes_storage(t, base);
      if (as_base == AsBase::kElement && whole_view && drops_leading_ones(t, base)) {
        key.push_back(kTensor);  // as a base tensor of the storage's shape is keyed
        put(key, static_cast<int8_t>(t.scalar_type()));
        put_shape(key, base);
        *view_out = 0;
        Py_XDECREF(view);
        Py_XDECREF(storage);
        Py_DECREF(obj);
        return array;
      }
      if (as_base == AsBase::kSelf && whole_view) {  // noted for the operands after it and the result's fit
        self_base_scratch = true;
        self_reshaped_scratch = !drops_leading_ones(t, base);
        self_base_sizes.clear();
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(base); ++i) {
          self_base_sizes.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(base, i)));
        }
        self_shape_scratch.assign(t.sizes().begin(), t.sizes().end());
      }
      const bool keyed_as_base = as_base == AsBase::kSelf ? whole_view
                                 : as_base == AsBase::kAlike && whole_view && alike_storage(t, base);
      if (keyed_as_base || as_base == AsBase::kAlike) {  // (kElement: not a whole view; keyed as it is below)
        if (keyed_as_base) {
          key.push_back(kTensor);
          put(key, static_cast<int8_t>(t.scalar_type()));
          put(key, static_cast<int8_t>(self_base_sizes.size()));
          for (int64_t s : self_base_sizes) put(key, s);
        } else {
          array = nullptr;  // an operand that is not a storage alike: the Python path
        }
        Py_XDECREF(view);
        Py_XDECREF(storage);
        Py_DECREF(obj);
        return array;
      }
      key.push_back(kTensor);
      put(key, static_cast<int8_t>(t.scalar_type()));
      put(key, static_cast<int8_t>(t.dim()));
      if (whole != nullptr) {  // keyed as the view of its whole padded extent (as_pointwise_fronts)
        for (int64_t s : whole->sizes) put(key, s);
        *view_out = 1;
        key.push_back(kView);
        for (int64_t s : whole->strides) put(key, s);
        put(key, whole->offset);
        put_shape(key, rt.st_shape.get(storage));
        Py_XDECREF(view);
        Py_XDECREF(storage);
        Py_DECREF(obj);
        return array;
      }
      for (int64_t s : t.sizes()) put(key, s);
      *view_out = view != Py_None;
      if (view != Py_None) {  // the geometry the executable was built for: strides, offset, base shape
        key.push_back(kView);
        for (int64_t s : t.strides()) put(key, s);
        put(key, t.storage_offset());
        put_shape(key, rt.st_shape.get(storage));
        if (casts(view)) {  // the storage's dtype (a view of the storage's own dtype has no cast)
          key.push_back(kCast);
          put(key, cast_source(view));
        }
      }
    }
    Py_XDECREF(view);
    Py_XDECREF(storage);
  }
  Py_DECREF(obj);
  return array;
}

// The Python number a wrapped scalar tensor stands for (what the Python kernel receives in its place).
PyObject* wrapped_number(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case c10::ScalarType::Double: return PyFloat_FromDouble(*t.const_data_ptr<double>());
    case c10::ScalarType::Float: return PyFloat_FromDouble(*t.const_data_ptr<float>());
    case c10::ScalarType::Long: return PyLong_FromLongLong(*t.const_data_ptr<int64_t>());
    case c10::ScalarType::Bool: return PyBool_FromLong(*t.const_data_ptr<bool>());
    default: TORCH_CHECK(false, "torchtpu_lab recorder: a wrapped scalar of type ", t.scalar_type());
  }
}

// The device a tpu Device argument names (a bare "tpu": the thread's current device), or -1.
long named_device(const c10::IValue& v) {
  if (!v.isDevice() || v.toDevice().type() != c10::DeviceType::PrivateUse1) return -1;
  const c10::DeviceIndex index = v.toDevice().index();
  return index < 0 ? current_device() : index;
}

// Whether tensor `t` broadcasts to `shape` (an undefined tensor: nothing to broadcast).
bool broadcasts_to(const at::Tensor& t, c10::IntArrayRef shape) {
  if (!t.defined()) return true;
  const auto other = t.sizes();
  if (other.size() > shape.size()) return false;
  for (size_t d = 1; d <= other.size(); ++d) {
    const int64_t o = other[other.size() - d];
    if (o != 1 && o != shape[shape.size() - d]) return false;
  }
  return true;
}

// Whether every other tensor argument broadcasts to `self`'s shape (the first argument's): what an in-place op
// asks of its operands, so a whole view's `self` keyed as its storage records the same op (leading size-1 dims
// broadcast alike). Asked only when `self` was keyed so; otherwise the call is PyTorch's error, which its Python
// path raises without a lesson.
bool others_broadcast_to_self(const torch::jit::Stack& stack, size_t base, size_t n) {
  if (n == 0 || !stack[base].isTensor()) return false;
  const auto self = stack[base].toTensor().sizes();
  for (size_t i = 1; i < n; ++i) {
    const c10::IValue& v = stack[base + i];
    if (v.isTensor() && !broadcasts_to(v.toTensor(), self)) return false;
  }
  return true;
}

// How tensor_input keys argument i (`t`) of an in-place pointwise op (`self_as_base`): `self` as its storage where
// it is all of it; after a `self` reshaped so, every other tensor operand as a storage alike (of self's shape).
AsBase as_base_at(size_t i, bool self_as_base) {
  if (!self_as_base) return AsBase::kNo;
  if (i == 0) return AsBase::kSelf;
  return self_reshaped_scratch ? AsBase::kAlike : AsBase::kNo;
}

// Whether every element of a list argument is a Python number (a `Scalar[]`; an empty list is not one).
bool numbers_only(c10::ArrayRef<c10::IValue> list) {
  if (list.empty()) return false;
  for (const c10::IValue& x : list) {
    if (!x.isDouble() && !x.isInt() && !x.isBool()) return false;
  }
  return true;
}

// The key of a call, and the arrays of its tensor arguments by position; false where the recorded path does
// not apply to these arguments. `dynamic`: per argument, whether a number there is a graph input (the executor's
// `dynamic_scalars` and `encode.op_plan` positions): keyed by its type only, as runtime/fast_keys.py keys it, so
// a new value (an optimizer's step size, `x / scale`) finds the same entry.
bool build_key(const c10::OperatorHandle& op, const torch::jit::Stack& stack, std::string& key,
               std::vector<PyObject*>& arrays, std::vector<PyObject*>& storages, long pending_device,
               const std::vector<char>& dynamic, bool self_as_base = false,
               const std::vector<Whole>* wholes = nullptr, bool elements_as_base = false) {
  const auto& formals = op.schema().arguments();
  const size_t n = formals.size();
  const size_t base = stack.size() - n;
  TORCH_CHECK(dynamic.size() == n, "torchtpu_lab recorder: ", op.schema().name(), " has ", n, " arguments, ",
              dynamic.size(), " flags");
  key.clear();
  put(key, static_cast<int8_t>(at::globalContext().float32MatmulPrecision()));
  put(key, static_cast<int8_t>(c10::get_default_dtype_as_scalartype()));  // the executor keys both alike
  arrays.assign(n, nullptr);
  storages.assign(n, nullptr);
  views_scratch.assign(n, 0);
  elements_scratch.clear();
  element_storages.clear();
  element_views.clear();
  element_start.assign(n, -1);
  self_base_scratch = false;
  self_reshaped_scratch = false;
  bool any_tensor = false;
  bool names_device = false;  // a Device argument (a factory's; _to_copy's or new_zeros's target)
  long named = -1;            // the first one's tpu device, -1 for another kind
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = stack[base + i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {  // an absent optional tensor as a C++ caller passes it (conv2d's bias): None to Python
        key.push_back(kNone);
        continue;
      }
      if (t.device().type() == c10::DeviceType::PrivateUse1) {
        const Whole* whole = wholes != nullptr && (*wholes)[i].active ? &(*wholes)[i] : nullptr;
        PyObject* array =
            tensor_input(t, pending_device, key, &storages[i], &views_scratch[i], as_base_at(i, self_as_base), whole);
        if (array == nullptr) return false;
        arrays[i] = array;
        any_tensor = true;
      } else if (t.unsafeGetTensorImpl()->is_wrapped_number() && t.device().is_cpu() && t.dim() == 0) {
        key.push_back(kWrapped);  // a Python number PyTorch wrapped (x * 0.5): a constant keyed by its value,
        put(key, static_cast<int8_t>(t.scalar_type()));  // or a graph input keyed by its type
        if (dynamic[i]) {
          switch (t.scalar_type()) {
            case c10::ScalarType::Double: case c10::ScalarType::Float: case c10::ScalarType::Long:
            case c10::ScalarType::Bool: continue;
            default: return false;
          }
        }
        switch (t.scalar_type()) {
          case c10::ScalarType::Double: put(key, *t.const_data_ptr<double>()); break;
          case c10::ScalarType::Float: put(key, *t.const_data_ptr<float>()); break;
          case c10::ScalarType::Long: put(key, *t.const_data_ptr<int64_t>()); break;
          case c10::ScalarType::Bool: put(key, *t.const_data_ptr<bool>()); break;
          default: return false;
        }
      } else {
        return false;
      }
    } else if (v.isNone()) {
      key.push_back(kNone);
    } else if (v.isBool() || v.isInt() || v.isDouble()) {
      key.push_back(v.isBool() ? kBool : v.isInt() ? kInt : kDouble);
      if (dynamic[i]) {
        // a graph input, keyed by its type and by whether it is its default: call_python_kernel leaves a default
        // out, so the executable the Python path teaches has it as a constant (`add(x, y)`'s alpha), not an input
        put(key, is_default(formals[i], v));
      } else if (v.isBool()) {
        put(key, v.toBool());
      } else if (v.isInt()) {
        put(key, v.toInt());
      } else {
        put(key, v.toDouble());
      }
    } else if (v.isIntList()) {
      key.push_back(kInts);
      const auto ints = v.toIntList();
      put(key, static_cast<int64_t>(ints.size()));
      for (int64_t x : ints) put(key, x);
    } else if (v.isBoolList()) {  // a backward's output_mask
      key.push_back(kBools);
      const auto bools = v.toBoolList();
      put(key, static_cast<int64_t>(bools.size()));
      for (bool x : bools) put(key, x);
    } else if (v.isString()) {
      const auto& s = v.toStringRef();
      key.push_back(kString);
      put(key, static_cast<int64_t>(s.size()));
      key.append(s);
    } else if (v.isDevice()) {
      if (wholes != nullptr) {  // (it must name the call's device, below): as bounded.py's inner call, which names none
        key.push_back(kNone);
      } else {
        key.push_back(kDevice);
        put(key, static_cast<int8_t>(v.toDevice().type()));
        put(key, static_cast<int8_t>(v.toDevice().index()));
      }
      if (!names_device) named = named_device(v);
      names_device = true;
    } else if (v.isTensorList()) {  // torch.cat's tensors, each keyed as a tensor argument is
      // (an append into spare capacity is keyed apart, by as_append below; one that does not fit, taken for a
      // plain cat here, would still compute the concatenation, only in a storage of its own)
      const auto list = v.toTensorList();
      key.push_back(kTensors);
      put(key, static_cast<int64_t>(list.size()));
      element_start[i] = static_cast<int>(elements_scratch.size());
      for (size_t j = 0; j < list.size(); ++j) {
        const at::Tensor t = list.get(j);
        if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) return false;
        PyObject* storage = nullptr;
        char view = 0;
        const AsBase as_base = elements_as_base && i == 0 ? AsBase::kElement : AsBase::kNo;
        PyObject* array = tensor_input(t, pending_device, key, &storage, &view, as_base);
        if (array == nullptr) return false;
        elements_scratch.push_back(array);
        element_storages.push_back(storage);
        element_views.push_back(view);
      }
      any_tensor = any_tensor || list.size() > 0;
    } else if (v.isList() && dynamic[i] && numbers_only(v.toListRef())) {  // `Scalar[]`, a number per element
      // of a foreach op (an optimizer's step sizes): each a graph input (dyn_input), keyed by its type
      const c10::ArrayRef<c10::IValue> list = v.toListRef();
      key.push_back(kNumbers);
      put(key, static_cast<int64_t>(list.size()));
      for (const c10::IValue& x : list) key.push_back(x.isDouble() ? kDouble : x.isInt() ? kInt : kBool);
    } else if (v.isList()) {  // `Tensor?[]`, advanced indexing's indices: each element keyed as a tensor argument
      // is, or absent (its array slot empty: a list's arrays stay at their elements' positions)
      const c10::ArrayRef<c10::IValue> list = v.toListRef();
      key.push_back(kOptionalTensors);
      put(key, static_cast<int64_t>(list.size()));
      element_start[i] = static_cast<int>(elements_scratch.size());
      for (const c10::IValue& x : list) {
        if (x.isNone() || (x.isTensor() && !x.toTensor().defined())) {
          key.push_back(kNone);
          elements_scratch.push_back(nullptr);
          element_storages.push_back(nullptr);
          element_views.push_back(0);
          continue;
        }
        if (!x.isTensor() || x.toTensor().device().type() != c10::DeviceType::PrivateUse1) return false;
        PyObject* storage = nullptr;
        char view = 0;
        PyObject* array = tensor_input(x.toTensor(), pending_device, key, &storage, &view);
        if (array == nullptr) return false;
        elements_scratch.push_back(array);
        element_storages.push_back(storage);
        element_views.push_back(view);
        any_tensor = true;
      }
    } else {
      return false;  // generators, complex numbers, ...: the Python kernel
    }
  }
  factory_scratch = !any_tensor;
  if (self_base_scratch && !self_reshaped_scratch && !others_broadcast_to_self(stack, base, n)) return false;
  // a call naming a device is this path's when it makes its tensor where the call's other work is: the pending
  // graph's device (fused mode), the device strict mode runs it on. Naming another (`x.to("cpu")`, `x.to("tpu:1")`
  // from tpu:0) is a transfer: the Python kernel's, and never keyed, so its Python path teaches nothing.
  if (names_device && named != pending_device) return false;
  return any_tensor || names_device;
}

// The dim along which growth.py marked t's storage as grown (growth._GROWN_IDS), with that Storage (borrowed: t
// holds it); -1 when it is not grown, or t is not over a Storage of ours, or (`view_only`) t is its base tensor.
long grown_dim(const at::Tensor& t, bool view_only, PyObject** storage_out) {
  PyObject* storage = nullptr;
  PyObject* view = nullptr;
  if (!data_ref(t, &storage, &view) || (view_only && view == Py_None) || Py_TYPE(storage) != rt.storage_type ||
      casts(view)) {
    return -1;
  }
  OwnedRef id(PyLong_FromVoidPtr(storage));
  if (id.p == nullptr) throw python_error();
  PyObject* known = PyDict_GetItemWithError(rt.grown_ids, id.p);  // borrowed
  if (known == nullptr) {
    if (PyErr_Occurred()) throw python_error();
    return -1;
  }
  if (!PyTuple_Check(known) || PyTuple_GET_SIZE(known) < 1) return -1;
  const long g = PyLong_AsLong(PyTuple_GET_ITEM(known, 0));
  if (g == -1 && PyErr_Occurred()) throw python_error();
  *storage_out = storage;
  return g;
}

// x's Storage (borrowed: x holds it) when x is the first n >= 1 positions along d of a storage growth.py marked as
// grown along d — the whole storage elsewhere, in its contiguous strides, at offset 0 — as growth._padded_length
// decides it; else nullptr. `front_only`: x must be a view of that storage (an append's x), not its base tensor.
PyObject* grown_front(const at::Tensor& x, int64_t d, bool front_only) {
  const int64_t rank = x.dim();
  if (rank == 0 || d < 0 || d >= rank || x.numel() == 0 || x.storage_offset() != 0 ||
      !data_in_storage(rt.tensor_type)) {
    return nullptr;
  }
  PyObject* storage = nullptr;
  if (grown_dim(x, front_only, &storage) != d) return nullptr;
  PyObject* shape = rt.st_shape.get(storage);
  if (PyTuple_GET_SIZE(shape) != rank) return nullptr;
  int64_t stride = 1;
  for (int64_t i = rank - 1; i >= 0; --i) {
    const int64_t b = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    if (x.stride(i) != stride || (i != d && x.size(i) != b)) return nullptr;
    stride *= std::max<int64_t>(b, 1);
  }
  return storage;
}

// An append's key into `key`: `tag` ('A' into spare capacity, 'E' a first append), the dtype, d, the grown
// storage's shape (`shape`; none for a first append) and the piece's own key; false where the piece has none.
bool append_key(char tag, const at::Tensor& piece, int64_t d, PyObject* shape, long device, std::string& key) {
  std::string piece_key;
  PyObject* piece_storage = nullptr;
  char piece_view = 0;
  if (tensor_input(piece, device, piece_key, &piece_storage, &piece_view) == nullptr) return false;
  key.clear();
  key.push_back(tag);
  put(key, static_cast<int8_t>(piece.scalar_type()));
  put(key, static_cast<int8_t>(d));
  if (shape != nullptr) put_shape(key, shape);
  key.append(piece_key);
  return true;
}

// Whether a `cat` of an empty accumulator x and a piece (`torch.cat([torch.tensor([]), piece], d)`, how a
// DynamicCache starts each layer's keys) is growth.py's first append, as growth._appendable decides it: one dtype,
// a non-empty piece of rank >= 1, and x 1-d or the piece's shape with 0 positions along d. Its key — dtype, d and
// the piece's own key — fixes the new buffer's capacity (growth._capacity of the piece's positions), so n is 0
// and append_scratch describes the call with x's (empty) storage as the old one.
bool as_first_append(const at::Tensor& x, const at::Tensor& piece, int64_t d, long device, std::string& key) {
  const int64_t rank = piece.dim();
  if (rank == 0 || piece.numel() == 0 || x.scalar_type() != piece.scalar_type() || d < -rank || d >= rank) {
    return false;
  }
  if (d < 0) d += rank;
  if (x.dim() != 1) {
    if (x.dim() != rank) return false;
    for (int64_t i = 0; i < rank; ++i) {
      if (x.size(i) != (i == d ? 0 : piece.size(i))) return false;
    }
  }
  PyObject* storage = nullptr;
  PyObject* view = nullptr;
  if (!data_in_storage(rt.tensor_type) || !data_ref(x, &storage, &view) || Py_TYPE(storage) != rt.storage_type ||
      casts(view)) {
    return false;
  }
  if (!append_key('E', piece, d, nullptr, device, key)) return false;
  append_scratch = {true, storage, d, 0, piece.size(d)};
  return true;
}

// Whether a `cat` call (already keyed by build_key) is an append into spare capacity, as growth._appendable and
// _append's no-new-buffer branch decide it: two tensors of one dtype and rank; x the front of a storage
// growth.py marked as grown along d (grown_front); the piece equal to x off d, with k >= 1 positions that fit
// (n + k <= capacity). If so, `key` becomes the append's key — dtype, d, the storage's shape and the piece's own
// key, without n — and append_scratch describes the call. An empty x is as_first_append's.
bool as_append(const torch::jit::Stack& stack, size_t base, long device, std::string& key) {
  append_scratch.active = false;
  if (!stack[base].isTensorList() || !stack[base + 1].isInt()) return false;
  const auto list = stack[base].toTensorList();
  if (list.size() != 2) return false;
  const at::Tensor x = list.get(0);
  const at::Tensor piece = list.get(1);
  if (x.numel() == 0) return as_first_append(x, piece, stack[base + 1].toInt(), device, key);
  const int64_t rank = x.dim();
  if (rank == 0 || piece.dim() != rank || x.scalar_type() != piece.scalar_type()) return false;
  int64_t d = stack[base + 1].toInt();
  if (d < -rank || d >= rank) return false;
  if (d < 0) d += rank;
  PyObject* storage = grown_front(x, d, /*front_only=*/true);
  if (storage == nullptr) return false;
  PyObject* shape = rt.st_shape.get(storage);
  for (int64_t i = 0; i < rank; ++i) {
    if (i != d && piece.size(i) != x.size(i)) return false;
  }
  const int64_t n = x.size(d);
  const int64_t k = piece.size(d);
  if (k < 1 || n + k > PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d))) return false;
  if (!append_key('A', piece, d, shape, device, key)) return false;
  append_scratch = {true, storage, d, n, k};
  return true;
}

// Whether a `scaled_dot_product_attention` call (already keyed by build_key) is one padded_attention._fused runs
// on padded keys: no dropout, key and value of rank 4 the fronts of storages grown along dim 2 (the sequence:
// grown_front) with one length n, and no mask or one that is itself the front of a storage grown along its last
// dim to the same n, 1 < n < its capacity, which is at least the keys' (bounded.attention_mask then reads it
// over the keys' capacity: a view of that storage its key fixes). Its Python path keyed everything else it
// decides by (the query's geometry, the dtypes and shapes, the mask's storage, is_causal, scale, enable_gqa, the
// matmul precision), so those make the key, without n: `key` becomes that and padded_scratch holds n.
bool as_padded_attention(const torch::jit::Stack& stack, size_t base, long device, std::string& key) {
  padded_scratch.active = false;
  // (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
  const c10::IValue& mask = stack[base + 3];
  if (!stack[base].isTensor() || !stack[base + 1].isTensor() || !stack[base + 2].isTensor() ||
      !(mask.isNone() || mask.isTensor()) || !stack[base + 4].isDouble() || stack[base + 4].toDouble() != 0.0 ||
      !stack[base + 5].isBool() || !stack[base + 7].isBool()) {
    return false;
  }
  const at::Tensor& k = stack[base + 1].toTensor();
  const at::Tensor& v = stack[base + 2].toTensor();
  if (k.dim() != 4 || v.dim() != 4 || k.size(2) != v.size(2)) return false;
  PyObject* storages[] = {grown_front(k, 2, false), grown_front(v, 2, false), nullptr};
  if (storages[0] == nullptr || storages[1] == nullptr) return false;
  if (mask.isTensor()) {
    const at::Tensor& m = mask.toTensor();
    if (!m.defined() || m.dim() == 0 || m.size(-1) != k.size(2) || k.size(2) < 2) return false;
    storages[2] = grown_front(m, m.dim() - 1, /*front_only=*/true);
    if (storages[2] == nullptr) return false;
    PyObject* shape = rt.st_shape.get(storages[2]);
    const int64_t capacity = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, PyTuple_GET_SIZE(shape) - 1));
    const int64_t key_capacity = PyLong_AsLongLong(PyTuple_GET_ITEM(rt.st_shape.get(storages[0]), 2));
    if (k.size(2) >= capacity || capacity < key_capacity) return false;
  }
  std::string padded(1, 'P');
  put(padded, static_cast<int8_t>(at::globalContext().float32MatmulPrecision()));  // the program's matmuls
  PyObject* q_storage = nullptr;
  char q_view = 0;
  if (tensor_input(stack[base].toTensor(), device, padded, &q_storage, &q_view) == nullptr) return false;
  for (int i = 0; i < 3; ++i) {
    if (storages[i] == nullptr) {  // no mask
      padded.push_back(kNone);
      continue;
    }
    put(padded, static_cast<int8_t>((i == 0 ? k : i == 1 ? v : mask.toTensor()).scalar_type()));
    put_shape(padded, rt.st_shape.get(storages[i]));
  }
  put(padded, stack[base + 5].toBool());
  const c10::IValue& scale = stack[base + 6];
  if (scale.isNone()) {
    padded.push_back(kNone);
  } else if (scale.isDouble()) {
    padded.push_back(kDouble);
    put(padded, scale.toDouble());
  } else {
    return false;
  }
  put(padded, stack[base + 7].toBool());
  key = std::move(padded);
  padded_scratch = {true, k.size(2)};
  return true;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes);

// Whether bounded.py's rewrites of one inner call are made here now: not inside a rewrite (its inner calls are
// never rewritten again), and not turned off (bounded.NATIVE).
bool rewrites_here() {
  return PyList_GET_ITEM(rt.bounded_active, 0) == Py_False && PyList_GET_ITEM(rt.bounded_native, 0) == Py_True;
}

// Whether t is a front as growth.front decides it: a view of a storage growth.py marked as grown along g, whose
// one dim with the storage's stride at g holds 1 < n < capacity positions (of two such, an unfold's, the longer),
// no dim empty, and whose geometry with more positions there (growth._room: the capacity, less the start of a view
// a few positions in) stays inside the storage. `w` gets that whole geometry, size-1 dims with their contiguous
// stride (a view op derives theirs from the length: the whole extent's key must not).
bool front_of(const at::Tensor& t, Whole& w) {
  PyObject* storage = nullptr;
  const long g = t.dim() == 0 ? -1 : grown_dim(t, /*view_only=*/true, &storage);
  if (g < 0) return false;
  PyObject* shape = rt.st_shape.get(storage);
  const Py_ssize_t rank = PyTuple_GET_SIZE(shape);
  if (g >= rank) return false;
  std::vector<int64_t> base(static_cast<size_t>(rank));
  int64_t total = 1;
  for (Py_ssize_t i = 0; i < rank; ++i) {
    base[static_cast<size_t>(i)] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    total *= base[static_cast<size_t>(i)];
  }
  const int64_t capacity = base[static_cast<size_t>(g)];
  const int64_t step = contiguous_strides(base)[static_cast<size_t>(g)];
  // growth._grown_axis: one dim walking the grown positions, or two (an unfold's windows and window), the longer
  int64_t found = -1, other = -1;
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (t.size(i) == 0) return false;
    if (t.stride(i) == step && 1 < t.size(i) && t.size(i) < capacity) {
      if (other >= 0) return false;
      (found < 0 ? found : other) = i;
    }
  }
  if (found < 0) return false;
  if (other >= 0) {
    if (t.size(found) == t.size(other)) return false;
    if (t.size(other) > t.size(found)) found = other;
  }
  // growth._room: the capacity, less the start of a view a few positions in
  int64_t rest = t.storage_offset();
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (i != found) rest += (t.size(i) - 1) * t.stride(i);
  }
  const int64_t room = std::min(capacity, (total - 1 - rest) / step + 1);
  if (room < capacity && (t.storage_offset() / step) % capacity >= t.size(found)) return false;
  if (room <= t.size(found)) return false;
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  sizes[static_cast<size_t>(found)] = room;
  const std::vector<int64_t> canonical = contiguous_strides(sizes);
  w.strides.resize(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    w.strides[i] = sizes[i] == 1 ? canonical[i] : t.stride(static_cast<int64_t>(i));
  }
  w.active = true;
  w.dim = found;
  w.length = t.size(found);
  w.capacity = room;
  w.offset = t.storage_offset();
  w.sizes = std::move(sizes);
  w.storage = storage;
  return true;
}

// Whether a call of a pointwise op (already keyed by build_key) is one bounded._pointwise runs on padded extents:
// no rewrite running its inner ops, no tensor list, some tpu tensor argument a front (front_of), every front along
// one dim of the broadcast output with one length, every other tensor of size 1 there (bounded._aligned). If so,
// `key` is the key of the same call on the fronts' whole extents cut to the smallest capacity among them — the
// inner call bounded.py makes, whose Python path teaches that key; a Device argument, which names the call's own
// device, is keyed as absent there, as that call passes none (a cast's `.to(device, dtype)`) — and fronts_scratch
// holds the output's grown dim and length.
bool as_pointwise_fronts(const c10::OperatorHandle& op, const torch::jit::Stack& stack, long device,
                         const std::vector<char>& dynamic, std::string& key) {
  fronts_scratch.active = false;
  if (PyDict_GET_SIZE(rt.grown_ids) == 0 || !rewrites_here() || !data_in_storage(rt.tensor_type)) {
    return false;
  }
  const size_t n = op.schema().arguments().size();
  const size_t base = stack.size() - n;
  wholes_scratch.resize(n);
  int64_t rank = 0;
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = stack[base + i];
    wholes_scratch[i].active = false;
    if (v.isTensorList()) return false;
    if (!v.isTensor() || !v.toTensor().defined()) continue;
    const at::Tensor& t = v.toTensor();
    rank = std::max<int64_t>(rank, t.dim());
    if (t.device().type() == c10::DeviceType::PrivateUse1) any = front_of(t, wholes_scratch[i]) || any;
  }
  if (!any) return false;
  int64_t d = -1, length = 0, capacity = 0;
  for (size_t i = 0; i < n; ++i) {
    const Whole& w = wholes_scratch[i];
    if (!w.active) continue;
    const int64_t out = rank - stack[base + i].toTensor().dim() + w.dim;
    if (d < 0) {
      d = out;
      length = w.length;
      capacity = w.capacity;
    } else if (out != d || w.length != length) {
      return false;
    } else {
      capacity = std::min(capacity, w.capacity);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = stack[base + i];
    if (wholes_scratch[i].active || !v.isTensor() || !v.toTensor().defined()) continue;
    const at::Tensor& t = v.toTensor();
    const int64_t at = d - (rank - t.dim());
    if (at >= 0 && t.size(at) != 1) return false;
  }
  for (size_t i = 0; i < n; ++i) {
    Whole& w = wholes_scratch[i];
    if (w.active) w.sizes[static_cast<size_t>(w.dim)] = capacity;
  }
  // the same arrays and storages again: a front is keyed otherwise, not read otherwise
  if (!build_key(op, stack, key, arrays_scratch, storages_scratch, device, dynamic, false, &wholes_scratch)) {
    return false;
  }
  fronts_scratch = {true, d, length};
  return true;
}

// Whether a call whose first argument x is a front (front_of) and whose other tensors are not is one of
// bounded.py's rewrites on x's whole extent: an `index_select(x, dim, index)` across another dim (bounded._select:
// beam search reorders each layer's grown cache by beam every token; `selects`), or a `linear(x, weight, bias)`
// or `native_layer_norm(x, normalized_shape, ...)` with the grown dim among x's leading dims, those it neither
// contracts nor normalizes (bounded._rowwise: a forward over a whole grown sequence). If so,
// `key` is the key of the same call on x's whole extent — the inner call bounded.py makes, whose Python path
// teaches that key — and fronts_scratch holds x's grown dim and length, the result's (and, for a reorder, x's
// storage, whose sequence the result continues).
bool as_first_front(const c10::OperatorHandle& op, const torch::jit::Stack& stack, long device,
                    const std::vector<char>& dynamic, std::string& key, bool selects) {
  fronts_scratch.active = false;
  if (PyDict_GET_SIZE(rt.grown_ids) == 0 || !rewrites_here() || !data_in_storage(rt.tensor_type)) {
    return false;
  }
  const size_t n = op.schema().arguments().size();
  const size_t base = stack.size() - n;
  if (n == 0 || !stack[base].isTensor()) return false;
  const at::Tensor& t = stack[base].toTensor();
  wholes_scratch.resize(n);  // (kept buffers, as as_pointwise_fronts keeps them)
  for (Whole& w : wholes_scratch) w.active = false;
  if (t.device().type() != c10::DeviceType::PrivateUse1 || !front_of(t, wholes_scratch[0])) return false;
  Whole ignored;
  for (size_t i = 1; i < n; ++i) {
    const c10::IValue& v = stack[base + i];
    if (v.isTensorList()) return false;
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == c10::DeviceType::PrivateUse1 &&
        front_of(v.toTensor(), ignored)) {
      return false;
    }
  }
  const int64_t g = wholes_scratch[0].dim;
  if (selects) {
    const c10::IValue& dim = stack[base + 1];
    if (n != 3 || !dim.isInt()) return false;
    const int64_t d = dim.toInt();
    if (d < -t.dim() || d >= t.dim() || (d + t.dim()) % t.dim() == g) return false;
  } else {
    const c10::IValue& shape = stack[base + 1];  // a layer norm's normalized_shape (a linear's weight)
    const int64_t trailing = shape.isIntList() ? static_cast<int64_t>(shape.toIntList().size()) : 1;
    if (g >= t.dim() - trailing) return false;  // it contracts or normalizes the grown dim: the ordinary path
  }
  if (!build_key(op, stack, key, arrays_scratch, storages_scratch, device, dynamic, false, &wholes_scratch)) {
    return false;
  }
  fronts_scratch = {true, g, wholes_scratch[0].length, selects ? wholes_scratch[0].storage : nullptr};
  return true;
}

// Whether a `clone(x, memory_format=...)` call is one bounded._copy makes on the padded extent (then it is recorded
// on fronts as a pointwise op is): the memory format is none, contiguous or preserve, and x has a broadcast dim
// (stride 0, more than one position: an expanded grown KV cache, grouped-query attention's `repeat_interleave`)
// or is a front whose dims before the grown one all have size 1, copied contiguous (asked for, or x contiguous):
// a batch of one, whose padded copy is contiguous as PyTorch's is. Any other copy of a front is bounded._copy's
// ordinary copy of n positions, which the Python path makes.
bool padded_copy(const torch::jit::Stack& stack, size_t base) {
  const c10::IValue& format = stack[base + 1];
  if (!stack[base].isTensor() || !(format.isNone() || format.isInt())) return false;
  if (format.isInt()) {
    const auto f = static_cast<c10::MemoryFormat>(format.toInt());
    if (f != c10::MemoryFormat::Contiguous && f != c10::MemoryFormat::Preserve) return false;
  }
  const at::Tensor& x = stack[base].toTensor();
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (x.stride(i) == 0 && x.size(i) > 1) return true;
  }
  const bool contiguous =
      (format.isInt() && static_cast<c10::MemoryFormat>(format.toInt()) == c10::MemoryFormat::Contiguous) ||
      x.is_contiguous();
  Whole w;
  if (!contiguous || x.device().type() != c10::DeviceType::PrivateUse1 || !front_of(x, w)) return false;
  for (int64_t i = 0; i < w.dim; ++i) {
    if (x.size(i) != 1) return false;
  }
  return true;
}

// Whether an `arange(end)` or `arange(0, end)` call (`from_zero`; already keyed by build_key) is one
// bounded._arange runs on a padded extent:
// `end` an int of at least 2 that an append grew a live tensor to within the last few syncs
// (growth.recent_capacity: `_LENGTHS[end]` is (capacity, a live weak reference, syncs then)). If so, `key` is the
// key of the same call with `capacity` for `end` — the inner call bounded.py makes, whose Python path teaches that
// key — and fronts_scratch holds the result's dim 0 and length `end`.
bool as_arange_front(const c10::OperatorHandle& op, const torch::jit::Stack& stack, long device,
                     const std::vector<char>& dynamic, std::string& key, bool from_zero) {
  fronts_scratch.active = false;
  const size_t n = op.schema().arguments().size();
  const size_t base = stack.size() - n;
  const size_t at = from_zero ? 1 : 0;  // `end`'s position: arange.start's `(0, end)` is bounded._arange's too
  if (n <= at || !stack[base + at].isInt() || dynamic[at] || PyDict_GET_SIZE(rt.lengths) == 0 ||
      !rewrites_here()) {
    return false;  // (`end` sizes the output: keyed by value, never a graph input the call would pass as n)
  }
  if (from_zero && (!stack[base].isInt() || stack[base].toInt() != 0 || dynamic[0])) return false;
  const int64_t end = stack[base + at].toInt();
  if (end < 2) return false;
  OwnedRef length(PyLong_FromLongLong(end));
  if (length.p == nullptr) throw python_error();
  PyObject* known = PyDict_GetItemWithError(rt.lengths, length.p);  // borrowed
  if (known == nullptr) {
    if (PyErr_Occurred()) throw python_error();
    return false;
  }
  if (!PyTuple_Check(known) || PyTuple_GET_SIZE(known) != 3 || !PyWeakref_Check(PyTuple_GET_ITEM(known, 1)) ||
      PyWeakref_GetObject(PyTuple_GET_ITEM(known, 1)) == Py_None) {
    return false;
  }
  PyObject* syncs = PyDict_GetItemWithError(rt.counters, rt.syncs_key);
  if (syncs == nullptr) {
    if (PyErr_Occurred()) throw python_error();
    return false;
  }
  const double since = PyFloat_AsDouble(syncs) - PyFloat_AsDouble(PyTuple_GET_ITEM(known, 2));
  const long long capacity = PyLong_AsLongLong(PyTuple_GET_ITEM(known, 0));
  if (PyErr_Occurred()) throw python_error();
  if (since < 0 || since > static_cast<double>(rt.recent_syncs)) return false;
  // growth.extent: the power of two above `end`, at least MIN_CAPACITY, within the capacity
  const int64_t bucket = std::max<int64_t>(rt.min_capacity, int64_t{1} << (64 - __builtin_clzll(end)));
  torch::jit::Stack call(stack.begin() + static_cast<std::ptrdiff_t>(base), stack.end());
  call[at] = c10::IValue(std::min<int64_t>(capacity, bucket));
  if (!build_key(op, call, key, arrays_scratch, storages_scratch, device, dynamic)) return false;
  fronts_scratch = {true, 0, end};
  return true;
}

// ---- the user's line, as telemetry.user_source finds it (nullptr: only Python can say; borrowed result) ----

// A frame's answer, remembered by (code object, instruction offset): a frame's line number is a scan of its
// code's line table, and looking it up in telemetry's tables builds and hashes a key (a fifth of a recorded op
// when those tables were keyed by code objects). An entry holds its code object (a code freed and another made
// at its address must not find the old answer) and its Source.
struct FrameMemo {
  PyObject* code = nullptr;
  int lasti = -1;
  PyObject* answer = nullptr;  // the frame's Source, or Py_True where telemetry skips the code
};
constexpr size_t kFrameMemoSize = 4096;
FrameMemo frame_memo[kFrameMemoSize];

int frame_lasti(PyFrameObject* frame) {
#if PY_VERSION_HEX >= 0x030B0000
  return PyFrame_GetLasti(frame);
#else
  return frame->f_lasti;
#endif
}

// The answer telemetry's tables give for a frame (borrowed), or nullptr where only Python can say: a code or a
// line its tables have not seen yet.
PyObject* frame_answer(PyFrameObject* frame, PyCodeObject* code) {
  const int lasti = frame_lasti(frame);
  const auto at = reinterpret_cast<uintptr_t>(code);
  FrameMemo& memo = frame_memo[((at >> 4) ^ (at >> 16) ^ (static_cast<uintptr_t>(lasti) * 2654435761u)) %
                               kFrameMemoSize];
  if (memo.code == reinterpret_cast<PyObject*>(code) && memo.lasti == lasti) return memo.answer;
  PyObject* skip = PyDict_GetItem(rt.internal_files, code->co_filename);
  if (skip == nullptr) return nullptr;
  PyObject* answer = Py_True;
  if (skip == Py_False) {
    PyObject* where = Py_BuildValue("(OiO)", code->co_filename, PyFrame_GetLineNumber(frame), code->co_name);
    answer = where == nullptr ? nullptr : PyDict_GetItem(rt.sources, where);
    Py_XDECREF(where);
    if (answer == nullptr) return nullptr;
  }
  PyObject* old_code = memo.code;
  PyObject* old_answer = memo.answer;
  memo.code = Py_NewRef(reinterpret_cast<PyObject*>(code));
  memo.lasti = lasti;
  memo.answer = Py_NewRef(answer);
  Py_XDECREF(old_code);
  Py_XDECREF(old_answer);
  return answer;
}

// Walks the current thread's frames from the innermost, calling visit(source, code) for each user frame (one
// telemetry does not skip; `source` borrowed, valid until the next frame is looked at) until visit returns
// true; false where a frame's code or line is not in telemetry's tables yet (only Python can say; no error set).
template <typename Visit>
bool walk_user_frames(Visit visit) {
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  if (frame == nullptr) return true;
  Py_INCREF(frame);
  bool known = true;
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    PyObject* answer = frame_answer(frame, code);
    bool stop = false;
    if (answer == nullptr) {
      known = false;
    } else if (answer != Py_True) {
      stop = visit(answer, code);
    }
    Py_DECREF(code);
    if (!known || stop) {
      Py_DECREF(frame);
      break;
    }
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  if (PyErr_Occurred()) PyErr_Clear();
  return known;
}

PyObject* user_source() {
  if (PyEval_GetFrame() == nullptr) return rt.backward;
  PyObject* found = nullptr;
  if (!walk_user_frames([&](PyObject* source, PyCodeObject*) {
        found = source;
        return true;
      })) {
    return nullptr;
  }
  if (found != nullptr) return found;
  return PyThread_get_thread_ident() == rt.main_thread ? Py_None : rt.backward;
}

// The stacks op records keep, shared as telemetry.user_stack shares them: a new tuple per op would be one more
// object per recorded op for the garbage collector to track. Keyed by the Sources (innermost first), which the
// tuple holds alive, so a key's pointers are never reused while it is here.
struct StackKeyHash {
  size_t operator()(const std::vector<PyObject*>& key) const noexcept {
    size_t h = key.size();
    for (PyObject* p : key) h = h * 1000003u ^ std::hash<PyObject*>()(p);
    return h;
  }
};
using StackTable = std::unordered_map<std::vector<PyObject*>, OwnedRef, StackKeyHash>;
// Never destroyed: a static's destructor would drop its references after the interpreter is gone.
StackTable& interned_stacks = *new StackTable();
constexpr size_t kMaxStacks = 4096;  // telemetry._MAX_STACKS

// The user's stack, outermost first, from `found` (its Sources, innermost first); a new reference.
PyObject* interned_stack(const std::vector<PyObject*>& found) {
  auto hit = interned_stacks.find(found);
  if (hit != interned_stacks.end()) return Py_NewRef(hit->second.p);
  const Py_ssize_t n = static_cast<Py_ssize_t>(found.size());
  PyObject* stack = PyTuple_New(n);
  if (stack == nullptr) throw python_error();
  for (Py_ssize_t i = 0; i < n; ++i) PyTuple_SET_ITEM(stack, i, Py_NewRef(found[n - 1 - i]));
  if (interned_stacks.size() >= kMaxStacks) interned_stacks.clear();
  interned_stacks.emplace(found, OwnedRef(Py_NewRef(stack)));
  return stack;
}

// telemetry.op_sources(0) — (the user's line, the user's stack outermost first) — from the same tables
// user_source reads, or nullptr (no error set) where only Python can say: a frame whose code or line the tables
// have not seen (Python interns it). Per op while a profile records: the walk in Python cost more than recording
// the op. No user frame (autograd's device thread runs every backward op with no Python frame at all): no
// stack, and user_source's answer for the thread.
PyObject* op_sources() {
  constexpr size_t kLimit = 24;  // telemetry.user_stack's limit
  // New references (a later frame's look-up may replace an earlier one's memo entry), in a vector kept per thread
  // (a profile walks every op's stack: a fresh vector was several allocations an op); no bytecode runs here, so
  // this cannot be entered again before the references are dropped.
  thread_local std::vector<PyObject*> found;
  struct Drop {
    ~Drop() {
      for (PyObject* source : found) Py_DECREF(source);
      found.clear();
    }
  } drop;
  const bool known = walk_user_frames([&](PyObject* source, PyCodeObject* code) {
    found.push_back(Py_NewRef(source));
    return PyUnicode_CompareWithASCIIString(code->co_name, "<module>") == 0 || found.size() == kLimit;
  });
  if (!known) return nullptr;
  if (found.empty()) {
    PyObject* where = PyEval_GetFrame() != nullptr && PyThread_get_thread_ident() == rt.main_thread ? Py_None
                                                                                                   : rt.backward;
    PyObject* pair = PyTuple_Pack(2, where, Py_None);
    if (pair == nullptr) throw python_error();
    return pair;
  }
  PyObject* stack = interned_stack(found);
  PyObject* pair = PyTuple_Pack(2, found.front(), stack);
  Py_DECREF(stack);
  if (pair == nullptr) throw python_error();
  return pair;
}

// ---- the pending graph (fused.py's record_one + graph_key.Segment.add + track_new) ----

PyObject* alloc(PyTypeObject* type) {
  PyObject* obj = type->tp_alloc(type, 0);
  if (obj == nullptr) throw python_error();
  return obj;
}

PyObject* increment(const Slot& slot, PyObject* obj) {  // obj.slot += 1; returns the new value (borrowed)
  PyObject* now = PyNumber_Add(slot.get(obj), rt.one);
  if (now == nullptr) throw python_error();
  slot.set_new(obj, now);
  return now;
}

void check(int rc) {
  if (rc < 0) throw python_error();
}

// Whether the node key (uid, wiring) equals `expected` (a (uid, ((position, index), ...)) tuple), without
// making the key: `wiring` holds each input's position and index.
bool same_key(PyObject* expected, PyObject* uid, const std::vector<std::pair<PyObject*, PyObject*>>& wiring) {
  PyObject* refs = PyTuple_GET_ITEM(expected, 1);
  if (PyTuple_GET_SIZE(refs) != static_cast<Py_ssize_t>(wiring.size())) return false;
  auto equal = [](PyObject* a, PyObject* b) {
    if (a == b) return true;
    const int rc = PyObject_RichCompareBool(a, b, Py_EQ);
    if (rc < 0) throw python_error();
    return rc == 1;
  };
  if (!equal(PyTuple_GET_ITEM(expected, 0), uid)) return false;
  for (size_t i = 0; i < wiring.size(); ++i) {
    PyObject* pair = PyTuple_GET_ITEM(refs, static_cast<Py_ssize_t>(i));
    if (!equal(PyTuple_GET_ITEM(pair, 0), wiring[i].first) || !equal(PyTuple_GET_ITEM(pair, 1), wiring[i].second)) {
      return false;
    }
  }
  return true;
}

// Segment.add's second guess when the node at `position` differs from `expect`'s: the last sync's own structure
// (the segment's `fallback`, tried once) becomes what the segment matches when it agrees up to and with this node.
bool switch_to_fallback(PyObject* segment, PyObject* expect, Py_ssize_t position, PyObject* uid,
                        const std::vector<std::pair<PyObject*, PyObject*>>& wiring) {
  PyObject* fallback = rt.seg_fallback.get(segment);
  if (fallback == nullptr || fallback == Py_None) return false;
  OwnedRef held(Py_NewRef(fallback));
  rt.seg_fallback.set(segment, Py_None);
  PyObject* alt = PyTuple_GET_ITEM(held.p, 0);
  if (position >= PyTuple_GET_SIZE(alt) || !same_key(PyTuple_GET_ITEM(alt, position), uid, wiring)) return false;
  for (Py_ssize_t i = 0; i < position; ++i) {
    const int rc = PyObject_RichCompareBool(PyTuple_GET_ITEM(alt, i), PyTuple_GET_ITEM(expect, i), Py_EQ);
    if (rc < 0) throw python_error();
    if (rc == 0) return false;
  }
  rt.seg_expect.set(segment, alt);
  rt.seg_plans.set(segment, PyTuple_GET_ITEM(held.p, 1));
  return true;
}

// graph_key.Segment.add(node, LazyValue), the same steps in the same order. While the segment matches the
// structure its last sync found, a key equal to that structure's at the node's position is not made at all.
void segment_add(PyObject* segment, PyObject* node, PyObject* inputs, PyObject* uid) {
  if (rt.seg_regular.get(segment) != Py_True) return;
  PyObject* token = rt.seg_token.get(segment);
  PyObject* leaves = rt.seg_leaves.get(segment);
  PyObject* leaf_sigs = rt.seg_leaf_sigs.get(segment);
  PyObject* leaf_pos = rt.seg_leaf_pos.get(segment);
  const Py_ssize_t n = PyList_GET_SIZE(inputs);
  // per input its (position, index): borrowed where an older object holds it, else kept in `made`
  thread_local std::vector<std::pair<PyObject*, PyObject*>> wiring;
  std::vector<OwnedRef> made;
  wiring.clear();
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* v = PyList_GET_ITEM(inputs, i);
    if (Py_TYPE(v) == rt.lazy_type) {
      PyObject* src = rt.lv_node.get(v);
      if (rt.n_segment.get(src) != token) {
        rt.seg_regular.set(segment, Py_False);
        return;
      }
      wiring.emplace_back(rt.n_position.get(src), rt.lv_index.get(v));
    } else if (Py_TYPE(v) == rt.array_type) {
      OwnedRef id(PyLong_FromVoidPtr(v));
      if (id.p == nullptr) throw python_error();
      PyObject* p = PyDict_GetItem(leaf_pos, id.p);  // borrowed: the dict holds it
      if (p == nullptr) {
        OwnedRef position(PyLong_FromSsize_t(PyList_GET_SIZE(leaves)));
        OwnedRef shape(position.p == nullptr ? nullptr : PyObject_GetAttr(v, rt.s_shape));
        OwnedRef dtype(shape.p == nullptr ? nullptr : PyObject_GetAttr(v, rt.s_dtype));
        OwnedRef sig(dtype.p == nullptr ? nullptr : PyTuple_Pack(2, shape.p, dtype.p));
        if (sig.p == nullptr || PyDict_SetItem(leaf_pos, id.p, position.p) < 0 || PyList_Append(leaves, v) < 0 ||
            PyList_Append(leaf_sigs, sig.p) < 0) {
          throw python_error();
        }
        p = position.p;  // the dict holds it
      }
      wiring.emplace_back(rt.minus_one, p);
    } else {  // a dynamic Python number: one input per use
      made.emplace_back(PyLong_FromSsize_t(PyList_GET_SIZE(leaves)));
      PyObject* p = made.back().p;
      if (p == nullptr || PyList_Append(leaves, v) < 0 ||
          PyList_Append(leaf_sigs, reinterpret_cast<PyObject*>(Py_TYPE(v))) < 0) {
        throw python_error();
      }
      wiring.emplace_back(rt.minus_one, p);
    }
  }
  PyObject* node_refs = rt.seg_refs.get(segment);
  const Py_ssize_t position = PyList_GET_SIZE(node_refs);
  rt.n_segment.set(node, token);
  PyObject* position_obj = PyLong_FromSsize_t(position);
  if (position_obj == nullptr) throw python_error();
  rt.n_position.set_new(node, position_obj);
  PyObject* weak = untracked(PyWeakref_NewRef(node, nullptr));
  if (weak == nullptr) throw python_error();
  const int rc = PyList_Append(node_refs, weak);
  Py_DECREF(weak);
  check(rc);
  if (rt.seg_matching.get(segment) == Py_True) {
    PyObject* expect = rt.seg_expect.get(segment);
    if (position < PyTuple_GET_SIZE(expect) && same_key(PyTuple_GET_ITEM(expect, position), uid, wiring)) return;
    if (switch_to_fallback(segment, expect, position, uid, wiring)) return;
    rt.seg_matching.set(segment, Py_False);  // the agreeing prefix becomes the keys so far
    OwnedRef prefix(PyTuple_GetSlice(expect, 0, position));
    PyObject* keys = prefix.p == nullptr ? nullptr : PySequence_List(prefix.p);
    if (keys == nullptr) throw python_error();
    rt.seg_node_keys.set_new(segment, keys);
  }
  OwnedRef refs(untracked(PyTuple_New(n)));
  if (refs.p == nullptr) throw python_error();
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* ref = untracked(PyTuple_Pack(2, wiring[i].first, wiring[i].second));
    if (ref == nullptr) throw python_error();
    PyTuple_SET_ITEM(refs.p, i, ref);
  }
  OwnedRef node_key(untracked(PyTuple_Pack(2, uid, refs.p)));
  if (node_key.p == nullptr) throw python_error();
  check(PyList_Append(rt.seg_node_keys.get(segment), node_key.p));
}

// One dynamic input of a learned call, as the Python path passes it: the entry's constant, an argument's array,
// or the Python number an argument stands for. A new reference, or nullptr with a Python error set.
// `length`: a length-free call's n (an append's, a padded attention's), else -1.
PyObject* dyn_input(const Source& s, const torch::jit::Stack& stack, size_t base,
                    const std::vector<PyObject*>& arrays, int64_t length) {
  if (s.position == kLength) {
    TORCH_CHECK(length >= 0, "torchtpu_lab recorder: a length input outside a length-free call");
    return PyLong_FromLongLong(length);
  }
  if (s.position < 0) return Py_NewRef(s.constant);
  if (s.element >= 0 && element_start[s.position] >= 0) {
    return Py_NewRef(elements_scratch[element_start[s.position] + s.element]);
  }
  if (s.element < 0 && arrays[s.position] != nullptr) return Py_NewRef(arrays[s.position]);
  // a number: the argument's, or (`element`) one of a `Scalar[]`'s (build_key keyed each by its type)
  const c10::IValue& iv = s.element >= 0 ? stack[base + s.position].toListRef()[s.element] : stack[base + s.position];
  return iv.isTensor() ? wrapped_number(iv.toTensor())
         : iv.isBool() ? PyBool_FromLong(iv.toBool())
         : iv.isInt()  ? PyLong_FromLongLong(iv.toInt())
                       : PyFloat_FromDouble(iv.toDouble());
}

// Storage.output's object of this shape (a tuple), torch dtype and byte size on `device`, its array not set yet
// (a new reference).
PyObject* new_storage(PyObject* shape, PyObject* dtype, PyObject* nbytes, long device, PyObject* alloc_source) {
  PyObject* storage = alloc(rt.storage_type);
  rt.st_array.set(storage, Py_None);
  rt.st_shape.set(storage, shape);
  rt.st_dtype.set(storage, dtype);
  PyObject* index = PyLong_FromLong(device);
  if (index == nullptr) {
    Py_DECREF(storage);
    throw python_error();
  }
  rt.st_device.set_new(storage, index);
  rt.st_nbytes.set(storage, nbytes);
  rt.st_source.set(storage, alloc_source);
  return storage;
}

PyObject* new_storage(const Output& e, long device, PyObject* alloc_source) {
  return new_storage(e.shape, e.dtype, e.nbytes, device, alloc_source);
}

// Memory accounting of an array a storage takes (with its origin: shape, dtype, source) or lets go: the native
// ledger's own calls when it counts (ledger.h), else memory.acquire / memory.release as configured.
void acquire_array(PyObject* array, PyObject* device, PyObject* nbytes, PyObject* origin) {
  if (ledger_ready()) {
    if (ledger_acquire(array, device, nbytes, origin) < 0) throw python_error();
    return;
  }
  PyObject* args[] = {array, device, nbytes, origin};
  PyObject* r = PyObject_Vectorcall(rt.acquire, args, 4, nullptr);
  if (r == nullptr) throw python_error();
  Py_DECREF(r);
}

void release_array(PyObject* array) {
  if (ledger_ready()) {
    if (ledger_release(array) < 0) throw python_error();
    return;
  }
  PyObject* r = PyObject_CallOneArg(rt.release, array);
  if (r == nullptr) throw python_error();
  Py_DECREF(r);
}

// A new base tensor over a new Storage that holds `array`, counted by the memory ledger: Storage.output with its
// array set, then tensor.make (a strict op's output, a compiled graph's). A new reference.
PyObject* array_tensor(PyObject* array, PyObject* shape, PyObject* dtype, PyObject* nbytes, c10::ScalarType scalar_type,
                       const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, long device,
                       PyObject* alloc_source) {
  OwnedRef storage(new_storage(shape, dtype, nbytes, device, alloc_source));
  OwnedRef origin(untracked(PyTuple_Pack(3, shape, dtype, alloc_source)));  // the ledger's entry (pyobjects.h)
  if (origin.p == nullptr) throw python_error();
  acquire_array(array, rt.st_device.get(storage.p), nbytes, origin.p);
  rt.st_array.set(storage.p, array);
  PyObject* t = make_tensor(rt.tensor_type, sizes, strides, scalar_type, static_cast<c10::DeviceIndex>(device),
                            storage.p, Py_None);
  if (t == nullptr) throw python_error();
  return t;
}

// values.set_array(storage, placeholder), an in-place op's write, as its Python steps do it: fused.track(storage)
// (noted once per sync, with the id of the concrete array it held then), then the Storage.array setter (a
// placeholder is acquired by nobody; a concrete array it replaces is released to memory accounting).
// Anything else the storage may hold (a FailedValue, a tracer) takes the Python function itself.
void write_placeholder(PyObject* storage, PyObject* lazy) {
  PyObject* old = rt.st_array.get(storage);
  const bool was_array = old != nullptr && Py_TYPE(old) == rt.array_type;
  if (old == nullptr || (!was_array && old != Py_None && Py_TYPE(old) != rt.lazy_type)) {
    PyObject* args[] = {storage, lazy};
    PyObject* r = PyObject_Vectorcall(rt.set_array, args, 2, nullptr);
    if (r == nullptr) throw python_error();
    Py_DECREF(r);
    return;
  }
  PyObject* pending = rt.pending;
  OwnedRef id(PyLong_FromVoidPtr(storage));
  if (id.p == nullptr) throw python_error();
  PyObject* storages = rt.pw_storages.get(pending);
  PyObject* ref = PyDict_GetItemWithError(storages, id.p);
  if (ref == nullptr && PyErr_Occurred()) throw python_error();
  if (ref == nullptr || PyWeakref_GetObject(ref) != storage) {  // not tracked since the last sync
    OwnedRef weak(untracked(PyWeakref_NewRef(storage, nullptr)));
    if (weak.p == nullptr) throw python_error();
    check(PyDict_SetItem(storages, id.p, weak.p));
    PyObject* prior = rt.pw_prior.get(pending);
    if (was_array) {
      OwnedRef old_id(PyLong_FromVoidPtr(old));
      if (old_id.p == nullptr) throw python_error();
      check(PyDict_SetItem(prior, id.p, old_id.p));
    } else {
      const int has = PyDict_Contains(prior, id.p);
      check(has);
      if (has == 1) check(PyDict_DelItem(prior, id.p));
    }
  }
  OwnedRef held(Py_NewRef(old));  // the slot's reference goes with the write; memory.release still reads it
  rt.st_array.set(storage, lazy);
  if (was_array) release_array(old);
}

// The placeholder LazyValue(node, index, shape, dtype) of output o (a new reference).
PyObject* new_lazy(PyObject* node, PyObject* index, const Output& o) {
  PyObject* lazy = untracked(alloc(rt.lazy_type));
  rt.lv_node.set(lazy, node);
  rt.lv_index.set(lazy, index);
  rt.lv_shape.set(lazy, o.shape);
  rt.lv_dtype.set(lazy, o.aval_dtype);
  rt.lv_value.set(lazy, Py_None);
  return lazy;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes);

// An append's result over its new padded storage (shape o.sizes): the first n + k positions along d, in the
// storage's strides (growth._append's View). A new reference to the tensor.
PyObject* front_tensor(const Output& o, const Append& a, PyObject* storage, long device) {
  std::vector<int64_t> sizes = o.sizes;
  sizes[a.d] = a.n + a.k;
  OwnedRef size(PyTuple_New(static_cast<Py_ssize_t>(sizes.size())));
  OwnedRef stride(PyTuple_New(static_cast<Py_ssize_t>(sizes.size())));
  if (size.p == nullptr || stride.p == nullptr) throw python_error();
  for (size_t i = 0; i < sizes.size(); ++i) {
    PyObject* a_size = PyLong_FromLongLong(sizes[i]);
    PyObject* a_stride = a_size == nullptr ? nullptr : PyLong_FromLongLong(o.strides[i]);
    if (a_stride == nullptr) {
      Py_XDECREF(a_size);
      throw python_error();
    }
    PyTuple_SET_ITEM(size.p, static_cast<Py_ssize_t>(i), a_size);
    PyTuple_SET_ITEM(stride.p, static_cast<Py_ssize_t>(i), a_stride);
  }
  OwnedRef fields(PyTuple_Pack(4, size.p, stride.p, rt.zero, Py_None));
  OwnedRef args(fields.p == nullptr ? nullptr : PyTuple_Pack(1, fields.p));
  // View(size, stride, 0, None) as tuple.__new__(View, fields) makes it: a NamedTuple's own __new__ is bytecode
  OwnedRef view(args.p == nullptr ? nullptr : PyTuple_Type.tp_new(rt.view_type, args.p, nullptr));
  if (view.p == nullptr) throw python_error();
  const std::vector<int64_t> contiguous = contiguous_strides(sizes);
  PyObject* out = make_tensor(rt.tensor_type, sizes, contiguous, o.scalar_type, static_cast<c10::DeviceIndex>(device),
                              storage, view.p);
  if (out == nullptr) throw python_error();
  if (contiguous != o.strides) {
    set_geometry(THPVariable_Unpack(out).unsafeGetTensorImpl(), sizes, o.strides, 0,
                 static_cast<size_t>(as_long(o.nbytes)));
  }
  return out;
}

// Output o's tensor over a new Storage holding the placeholder `lazy`, tracked by the pending work as
// fused.track_new does (a new reference); `front`: an append's, whose tensor is the front of that storage.
PyObject* output_tensor(const Output& o, PyObject* lazy, long device, PyObject* alloc_source,
                        const Append* front = nullptr) {
  OwnedRef storage(new_storage(o, device, alloc_source));  // Storage.output(shape, dtype, device, placeholder)
  rt.st_array.set(storage.p, lazy);
  PyObject* pending = rt.pending;
  PyObject* id = PyLong_FromVoidPtr(storage.p);
  PyObject* weak = id == nullptr ? nullptr : untracked(PyWeakref_NewRef(storage.p, nullptr));
  int rc = weak == nullptr ? -1 : PyDict_SetItem(rt.pw_storages.get(pending), id, weak);
  Py_XDECREF(weak);
  if (rc == 0) {
    PyObject* prior = rt.pw_prior.get(pending);
    if (PyDict_Contains(prior, id) == 1) rc = PyDict_DelItem(prior, id);
  }
  Py_XDECREF(id);
  check(rc);
  if (front != nullptr) return front_tensor(o, *front, storage.p, device);
  if (o.layout != nullptr) {  // tensor.make(storage, layout): the view's geometry reported on its TensorImpl
    PyObject* out = make_tensor(rt.tensor_type, o.sizes, contiguous_strides(o.sizes), o.scalar_type,
                                static_cast<c10::DeviceIndex>(device), storage.p, o.layout);
    if (out == nullptr) throw python_error();
    set_geometry(THPVariable_Unpack(out).unsafeGetTensorImpl(), o.sizes, o.strides, 0,
                 static_cast<size_t>(as_long(o.nbytes)));
    return out;
  }
  PyObject* out = make_tensor(rt.tensor_type, o.sizes, o.strides, o.scalar_type,
                              static_cast<c10::DeviceIndex>(device), storage.p, Py_None);
  if (out == nullptr) throw python_error();
  return out;
}

// An op with checks: its error flags — the node's leaves from `first` on — computed by the next sync and then
// noted for pending_errors.raise_pending (fused.also_compute(flags, pending_errors.callback(checks, name,
// source)), as executor._launch does). The callback is a functools.partial made here: no bytecode runs.
void also_compute_flags(const Entry& e, PyObject* node, size_t first, PyObject* source) {
  const Py_ssize_t k = static_cast<Py_ssize_t>(e.flags.size());
  if (e.checks == nullptr || k == 0) return;
  OwnedRef values(PyList_New(k));
  if (values.p == nullptr) throw python_error();
  for (Py_ssize_t j = 0; j < k; ++j) {
    OwnedRef index(PyLong_FromSize_t(first + static_cast<size_t>(j)));
    if (index.p == nullptr) throw python_error();
    PyList_SET_ITEM(values.p, j, new_lazy(node, index.p, e.flags[static_cast<size_t>(j)]));
  }
  OwnedRef callback(PyObject_CallFunctionObjArgs(rt.partial, rt.note_later, e.checks, e.name, source, nullptr));
  if (callback.p == nullptr) throw python_error();
  OwnedRef pair(PyTuple_Pack(2, values.p, callback.p));
  if (pair.p == nullptr || PyList_Append(rt.pw_extra.get(rt.pending), pair.p) < 0) throw python_error();
}

// The recorded path proper, under fused.LOCK. Returns the output tensor, or a tuple of them for an op with several
// outputs (a new reference).
// `write_to`: an in-place op's `self` storage, which takes the result as its array (values.set_array); the
// result is None then. Otherwise the result is a new output tensor (`front`: an append's, see front_tensor).
// `length`: a padded attention's n (an append's is front's).
PyObject* record(const Entry& e, const torch::jit::Stack& stack, size_t base, const std::vector<PyObject*>& arrays,
                 long device, PyObject* source, PyObject* alloc_source, PyObject* write_to,
                 const Append* front = nullptr, int64_t length = -1,
                 const std::vector<PyObject*>* write_each = nullptr) {
  PyObject* pending = rt.pending;
  const Py_ssize_t n = static_cast<Py_ssize_t>(e.dyn.size());
  PyObject* inputs = untracked(PyList_New(n));  // arrays, numbers, earlier placeholders
  if (inputs == nullptr) throw python_error();
  for (Py_ssize_t j = 0; j < n; ++j) {
    PyObject* v = dyn_input(e.dyn[j], stack, base, arrays, front != nullptr ? front->n : length);
    if (v == nullptr) {
      Py_DECREF(inputs);
      throw python_error();
    }
    PyList_SET_ITEM(inputs, j, v);
  }
  PyObject* node = nullptr;
  PyObject* lazy = nullptr;
  try {
    PyObject* seq = increment(rt.pw_seq, pending);
    node = untracked(alloc(rt.node_type));
    rt.n_key.set(node, e.signature);
    rt.n_uid.set(node, e.uid);
    rt.n_fn.set(node, e.run);
    rt.n_inputs.set_new(node, inputs);
    inputs = nullptr;
    rt.n_treedef.set(node, e.treedef);
    rt.n_avals.set(node, e.avals);
    rt.n_name.set(node, e.name);
    rt.n_source.set(node, source);
    rt.n_seq.set(node, seq);
    rt.n_segment.set(node, Py_None);
    rt.n_position.set(node, rt.minus_one);
    increment(rt.pw_recorded, pending);
    segment_add(rt.pw_segment.get(pending), node, rt.n_inputs.get(node), e.uid);
    PyObject* tail = rt.cut_tail.get(rt.cuts);
    PyObject* appended = PyObject_CallMethodOneArg(tail, rt.s_append, e.fn_id);
    if (appended == nullptr) throw python_error();
    Py_DECREF(appended);

    if (write_each != nullptr) {  // a foreach update: output i into storage i
      for (size_t i = 0; i <= e.more.size(); ++i) {
        OwnedRef index(PyLong_FromSize_t(i));
        if (index.p == nullptr) throw python_error();
        lazy = new_lazy(node, index.p, i == 0 ? e : e.more[i - 1]);
        write_placeholder((*write_each)[i], lazy);
        Py_CLEAR(lazy);
      }
      Py_DECREF(node);
      return Py_NewRef(Py_None);
    }
    if (write_to != nullptr) {
      lazy = new_lazy(node, rt.zero, e);
      write_placeholder(write_to, lazy);
      Py_CLEAR(lazy);
      also_compute_flags(e, node, 1, source);
      Py_DECREF(node);
      return Py_NewRef(Py_None);
    }
    if (e.more.empty()) {
      lazy = new_lazy(node, rt.zero, e);
      OwnedRef out(output_tensor(e, lazy, device, alloc_source, front));
      Py_CLEAR(lazy);
      also_compute_flags(e, node, 1, source);
      Py_DECREF(node);
      return out.release();
    }
    // several outputs: a tuple of tensors, each over a placeholder LazyValue(node, leaf), where `leaf` counts the
    // present outputs (those a mask leaves out are None)
    OwnedRef outs(PyTuple_New(static_cast<Py_ssize_t>(1 + e.more.size())));
    if (outs.p == nullptr) throw python_error();
    size_t leaf = 0;
    for (size_t i = 0; i <= e.more.size(); ++i) {
      const Output& o = i == 0 ? e : e.more[i - 1];
      if (o.absent) {
        PyTuple_SET_ITEM(outs.p, static_cast<Py_ssize_t>(i), Py_NewRef(Py_None));
        continue;
      }
      OwnedRef index(PyLong_FromSize_t(leaf++));
      if (index.p == nullptr) throw python_error();
      lazy = new_lazy(node, index.p, o);  // (a layer norm on a front: each output the front of its result)
      PyTuple_SET_ITEM(outs.p, static_cast<Py_ssize_t>(i), output_tensor(o, lazy, device, alloc_source, front));
      Py_CLEAR(lazy);
    }
    also_compute_flags(e, node, leaf, source);
    Py_DECREF(node);
    return outs.release();
  } catch (...) {
    Py_XDECREF(inputs);
    Py_XDECREF(node);
    Py_XDECREF(lazy);
    throw;
  }
}

bool flag(PyObject* state) { return rt.state_value.get(state) == Py_True; }

bool same_str(PyObject* a, PyObject* b) {  // a config string equal to an interned one
  if (a == b) return true;
  if (!PyUnicode_Check(a)) return false;
  const int c = PyUnicode_Compare(a, b);
  if (c == -1 && PyErr_Occurred()) PyErr_Clear();
  return c == 0;
}

// fused.LOCK, taken by lock_try_acquire, held for a scope (releasing runs no bytecode and cannot fail).
struct LockHeld {
  LockHeld() = default;
  LockHeld(const LockHeld&) = delete;
  LockHeld& operator=(const LockHeld&) = delete;
  ~LockHeld() { lock_release(rt.lock); }
};

// The device a call runs on: its first tpu tensor's (strict mode runs where its inputs are), else, for a factory
// (full, arange), the tpu device its arguments name; -1 when neither.
long call_device(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const size_t n = op.schema().arguments().size();
  long named = -1;
  for (size_t i = stack.size() - n; i < stack.size(); ++i) {
    if (stack[i].isTensor() && stack[i].toTensor().defined() &&
        stack[i].toTensor().device().type() == c10::DeviceType::PrivateUse1) {
      return stack[i].toTensor().device().index();
    }
    if (named < 0) named = named_device(stack[i]);
  }
  return named;
}

// Strict mode's repeated call, as executor._run_repeated runs it: the op's executable (JAX's C++ call of it)
// on the call's dynamic inputs, the cache-hit counter counted, the output array in a Storage (Storage.output:
// memory.acquire, then the array) and a tensor (tensor.make_base); for an in-place op (`write_to`: self's
// storage) the array becomes that storage's (values.set_array, as mutation.write_result does for a base of
// the result's shape and dtype), in the native ledger's own calls when it counts. Under fused.LOCK. Returns the
// output tensor or None (a new reference), or nullptr when the executable refused the inputs with a TypeError (a
// weak type it was not compiled for: the Python path lets jax.jit decide); any other error propagates as the
// Python path's.
PyObject* run_strict(const Entry& e, const torch::jit::Stack& stack, size_t base,
                     const std::vector<PyObject*>& arrays, PyObject* alloc_source, PyObject* write_to) {
  const size_t n = e.dyn.size();
  PyObject* small[8];
  std::vector<PyObject*> big;
  PyObject** args = small;
  if (n > 8) {
    big.resize(n);
    args = big.data();
  }
  size_t made = 0;  // new references taken before any bytecode can run: the borrowed arrays are safe
  for (; made < n; ++made) {
    args[made] = dyn_input(e.dyn[made], stack, base, arrays, -1);
    if (args[made] == nullptr) break;
  }
  PyObject* out = made == n ? PyObject_Vectorcall(e.call, args, n, nullptr) : nullptr;
  for (size_t j = 0; j < made; ++j) Py_DECREF(args[j]);
  if (out == nullptr) {
    if (made == n && PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      return nullptr;
    }
    throw python_error();
  }
  OwnedRef array;
  array.p = out;
  TORCH_CHECK(Py_TYPE(out) == rt.array_type, "torchtpu_lab recorder: ", PyUnicode_AsUTF8(e.name),
              "'s executable returned a ", Py_TYPE(out)->tp_name, ", not one array");
  PyObject* old = PyDict_GetItemWithError(rt.counters, rt.hits_key);  // counters["op_cache_hits"] += 1
  PyObject* now = old != nullptr ? PyNumber_Add(old, rt.one) : PyErr_Occurred() ? nullptr : PyFloat_FromDouble(1.0);
  if (now == nullptr || PyDict_SetItem(rt.counters, rt.hits_key, now) < 0) {
    Py_XDECREF(now);
    throw python_error();
  }
  Py_DECREF(now);
  if (write_to != nullptr) {  // a concrete array: the Storage.array setter's steps, in C with the native ledger
    if (ledger_ready()) {
      if (ledger_store(write_to, out) < 0) throw python_error();
      return Py_NewRef(Py_None);
    }
    PyObject* set_args[] = {write_to, out};
    PyObject* none = PyObject_Vectorcall(rt.set_array, set_args, 2, nullptr);
    if (none == nullptr) throw python_error();
    return none;
  }
  return array_tensor(out, e.shape, e.dtype, e.nbytes, e.scalar_type, e.sizes, e.strides, e.exec_device, alloc_source);
}

// What a kernel serves: a lowered op it records, a view op, or an in-place op whose functional op it records
// and writes into `self` (entries are learned from that functional op's Python path); a pointwise in-place op
// also on a `self` that is a whole storage seen without its leading size-1 dims, recorded on the storage; a
// lowered pointwise op runtime/bounded.py runs on padded extents, also recorded on fronts (as_pointwise_fronts); a
// functional foreach op (one node, a list of outputs) and an in-place one (that node, output i written into element
// i of `self`: runtime/foreach_kernels.py).
enum class Kind { kRecord = 0, kView = 1, kInplace = 2, kInplacePointwise = 3, kRecordOnFronts = 4, kRecordList = 5,
                  kInplaceList = 6 };

class RecordingKernel final : public c10::OperatorKernel {
 public:
  RecordingKernel(std::string name, std::string overload, PyObject* python, Kind kind, std::string learns,
                  std::string learns_overload, std::vector<char> dynamic)
      : name_(std::move(name)), overload_(std::move(overload)), python_(python), view_(kind == Kind::kView),
        inplace_(kind == Kind::kInplace || kind == Kind::kInplacePointwise || kind == Kind::kInplaceList),
        list_in_(kind == Kind::kInplaceList),
        list_out_(kind == Kind::kRecordList),
        pointwise_(kind == Kind::kInplacePointwise), appends_(name_ == "aten::cat" && overload_.empty()),
        attends_(name_ == "aten::scaled_dot_product_attention" && overload_.empty()),
        on_fronts_(kind == Kind::kRecordOnFronts),
        copies_(name_ == "aten::clone" && overload_.empty()),
        selects_(on_fronts_ && name_ == "aten::index_select" && overload_.empty()),
        rowwise_(on_fronts_ && (name_ == "aten::linear" || name_ == "aten::native_layer_norm") && overload_.empty()),
        transfers_(name_ == "aten::_to_copy" && overload_.empty()),
        ranges_(name_ == "aten::arange" && (overload_.empty() || overload_ == "start")),
        learns_(std::move(learns)),
        learns_overload_(std::move(learns_overload)),
        dynamic_(std::move(dynamic)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    pybind11::gil_scoped_acquire gil;
    if (try_record(op, stack)) return;
    misses.push_back({this, std::move(key_scratch), append_scratch.active    ? Unsized::kAppend
                                                    : padded_scratch.active ? Unsized::kAttention
                                                                            : Unsized::kNo});
    key_scratch = std::string();
    ++stats.python;
    ++handed_;
    try {
      call_python_kernel(python_, op, stack);
    } catch (...) {
      misses.pop_back();
      throw;
    }
    misses.pop_back();
  }

  // Whether the Python path of op name.overload teaches this kernel (its own op; an in-place op's functional).
  bool learns(const std::string& name, const std::string& overload) const {
    return name == learns_ && overload == learns_overload_;
  }
  bool is_view() const { return view_; }
  uint64_t handed() const { return handed_; }
  std::string qualified_name() const { return overload_.empty() ? name_ : name_ + "." + overload_; }
  Table& table() { return table_; }
  Table& strict_table() { return strict_; }
  Table& unsized_table() { return unsized_; }

 private:
  // Whether this call was recorded here; leaves the call's key in key_scratch (empty when it has none).
  bool try_record(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    key_scratch.clear();
    append_scratch.active = false;  // set by as_append or as_padded_attention below, for this call only
    padded_scratch.active = false;
    if (!rt.ready || !flag(rt.enabled)) return false;
    PyObject* mode = rt.state_value.get(rt.mode);
    const bool strict = !same_str(mode, rt.fused_str);
    if (strict && !same_str(mode, rt.strict_str)) return false;  // debug mode stays Python
    if (transfers_ && host_copy(*stack)) return true;
    if (strict && (list_in_ || list_out_)) return false;  // one program for the list: the Python path runs it
    if (strict && !view_) return try_run(op, stack);  // strict mode: a lowered or in-place op runs its learned
                                                      // executable; a view as in fused mode
    if (PyList_GET_ITEM(rt.interrupt, 0) != Py_False) return false;  // the Python entry raises it
    if (view_ && c10::InferenceMode::is_enabled()) return false;  // the Python view kernel's special case
    // While a profile records: the op's line and stack from one walk (telemetry.op_sources), its op record,
    // and (outermost calls only) its span at the runtime's door, as the Python path gives them (a view: only
    // the span; it records no op). The walk is Python, so it runs before the arguments are looked at: the
    // borrowed arrays and storages the key collects must not meet any bytecode (another thread could replace
    // them) before they are used.
    const bool profiling = PyList_GET_SIZE(rt.recorders) != 0 && !view_;
    PyObject* spans = PyList_GET_ITEM(rt.entry_spans, 0);
    const double t0 = profiling || spans != Py_None ? monotonic() : 0.0;
    OwnedRef sources;  // (source, stack) while profiling
    if (profiling) {
      sources.p = op_sources();  // the walk in C++ when every frame on it is known, else telemetry's own
      if (sources.p == nullptr) sources.p = PyObject_CallOneArg(rt.op_sources, rt.zero);
      if (sources.p == nullptr) throw python_error();
      spans = PyList_GET_ITEM(rt.entry_spans, 0);  // read again after bytecode ran
    }
    const long device = as_long(rt.pw_device.get(rt.pending));
    if (!adopt_plain(op, *stack)) throw python_error();
    spans = PyList_GET_ITEM(rt.entry_spans, 0);  // read again after bytecode ran
    if (!build_key(op, *stack, key_scratch, arrays_scratch, storages_scratch, device, dynamic_, pointwise_, nullptr,
                   list_in_)) {
      key_scratch.clear();
      return false;
    }
    if (factory_scratch && !has_pending()) {  // a factory with no graph to join runs now (executor._records)
      key_scratch.clear();
      return try_run(op, stack);
    }
    const size_t n = op.schema().arguments().size();
    const size_t base = stack->size() - n;
    if (appends_) as_append(*stack, base, device, key_scratch);
    if (attends_) as_padded_attention(*stack, base, device, key_scratch);
    Table& table = append_scratch.active || padded_scratch.active ? unsized_ : table_;
    // a pointwise op on fronts, an arange of a growing length: the call bounded.py's rewrite makes (and teaches)
    // on the whole extents, its result a front; on a miss, the call's own key stays, for the Python path
    const bool on_fronts = ((selects_ || rowwise_) &&
                            as_first_front(op, *stack, device, dynamic_, fronts_key_scratch, selects_)) ||
                           (on_fronts_ && !selects_ && !rowwise_ && (!copies_ || padded_copy(*stack, base)) &&
                            as_pointwise_fronts(op, *stack, device, dynamic_, fronts_key_scratch)) ||
                           (ranges_ &&
                            as_arange_front(op, *stack, device, dynamic_, fronts_key_scratch, !overload_.empty()));
    auto found = table.find(on_fronts ? fronts_key_scratch : key_scratch);
    if (found == table.end()) return false;
    const Entry& e = *found->second;
    const OnFronts fronts = fronts_scratch;  // (recording may run bytecode, which may record on this thread)
    fronts_scratch.active = false;
    if (e.laid_out && (view_ || inplace_ || list_in_ || on_fronts || append_scratch.active)) return false;
    if (on_fronts) {  // each output a padded result (bounded.grown's check), or the Python path
      auto padded = [&](const Output& o) {
        return o.absent || (static_cast<int64_t>(o.sizes.size()) > fronts.d &&
                            fronts.n < o.sizes[static_cast<size_t>(fronts.d)]);
      };
      if (!padded(e) || !std::all_of(e.more.begin(), e.more.end(), padded)) return false;
    }
    const bool outermost = spans != Py_None && !lock_owned();
    if (view_) {
      make_view(e, op, stack);
      if (outermost) note_profiled(e, t0, nullptr, spans);
      return true;
    }
    PyObject* source = Py_None;
    if (profiling) {
      source = PyTuple_GET_ITEM(sources.p, 0);
    } else if (flag(rt.track_sources) || e.checks != nullptr) {  // a check's error names the user's line
      source = user_source();
      if (source == nullptr) return false;  // a line Python has not seen: it interns it (and learns nothing new)
    }
    PyObject* alloc_source = Py_None;  // Storage.output's: the op's line, or its own look-up
    if (flag(rt.track_alloc)) {
      alloc_source = source != Py_None ? source : user_source();
      if (alloc_source == nullptr) return false;
    }
    if (!lock_try_acquire(rt.lock)) return false;  // another thread is inside the runtime: the Python kernel waits
    OwnedRef write_to;  // held: recording may run bytecode (a new leaf's shape) before the write
    OwnedRef out;
    const bool appending = append_scratch.active;
    bool loop_cut = false;  // an append that ended a loop's iteration: the graph is cut after it
    const int64_t length = padded_scratch.active ? padded_scratch.n : -1;  // (recording may run bytecode)
    padded_scratch.active = false;
    {
      const LockHeld held;
      if (appending) {
        const Append a = append_scratch;  // recording may run bytecode, which may append on this thread
        append_scratch.active = false;
        OwnedRef old(Py_NewRef(a.storage));
        out.p = record(e, *stack, base, arrays_scratch, device, source, alloc_source, nullptr, &a);
        loop_cut = mark_appended(out.p, old.p, a, profiling ? sources.p : nullptr);
      } else if (on_fronts) {  // the front of the padded result (bounded.grown)
        const Append front{true, nullptr, fronts.d, fronts.n, 0};
        OwnedRef reordered(fronts.source == nullptr ? nullptr : Py_NewRef(fronts.source));
        out.p = record(e, *stack, base, arrays_scratch, device, source, alloc_source, nullptr, &front);
        mark_grown(out.p, fronts.d, reordered.p);
      } else if (list_in_) {  // a foreach update: each element of `self` replaced whole by its output
        if (!independent_writes(*stack, base, n, e)) return false;
        // held, and copied off the thread's scratch: recording may run bytecode (a new leaf's shape), which may
        // record on this thread, before the writes
        std::vector<PyObject*> writes(element_storages.begin(), element_storages.begin() + 1 + e.more.size());
        std::vector<OwnedRef> held_writes;
        held_writes.reserve(writes.size());
        for (PyObject* w : writes) held_writes.emplace_back(Py_NewRef(w));
        // autograd's version counters, moved once per element as PyTorch's per-element fallback moves them (no
        // autograd kernel of a foreach update does), before any write: an inference tensor raises here, unchanged
        // (runtime/foreach_kernels._bump)
        for (const at::Tensor& t : (*stack)[base].toTensorList()) t.unsafeGetTensorImpl()->bump_version();
        out.p = record(e, *stack, base, arrays_scratch, device, source, alloc_source, nullptr, nullptr, -1, &writes);
      } else {
        if (inplace_) {  // the usual update: a base `self` (or a whole view's storage) the result replaces whole
          const at::Tensor& self = (*stack)[base].toTensor();
          const bool fits = self_base_scratch ? c10::IntArrayRef(self_base_sizes) == c10::IntArrayRef(e.sizes)
                                              : !views_scratch[0] && self.sizes() == c10::IntArrayRef(e.sizes);
          if (!fits || self.scalar_type() != e.scalar_type || overlaps_self(n)) return false;
          write_to.p = Py_NewRef(storages_scratch[0]);
        }
        out.p = record(e, *stack, base, arrays_scratch, device, source, alloc_source, write_to.p, nullptr, length);
      }
    }
    return_result(stack, base, n, out.p);
    ++stats.recorded;
    if (appending) {  // its op event is growth.appended's (above)
      if (outermost) note_profiled(e, t0, nullptr, spans);
    } else if (profiling || outermost) {
      note_profiled(e, t0, sources.release(), outermost ? spans : nullptr);
    }
    flush_if_needed(e, loop_cut);
    return true;
  }

  // Whether a tensor argument after `self` shares self's storage (`x.add_(x.t())`, `i.index_add_(0, i, v)`): CPU
  // refuses some such writes, op by op, which the Python path asks it (runtime/overlap.py).
  static bool overlaps_self(size_t n) {
    for (size_t i = 1; i < n; ++i) {
      if (storages_scratch[i] != nullptr && storages_scratch[i] == storages_scratch[0]) return true;
    }
    return false;
  }

  // Whether a foreach update's outputs may all be written at once (runtime/foreach_kernels._independent): each
  // element of `self` (the first list: element_storages from 0) a base tensor of its output's shape and dtype,
  // with a storage of its own that no other list's element at another index and no other tensor argument has.
  // Else the Python path runs the elements one after the other.
  static bool independent_writes(const torch::jit::Stack& stack, size_t base, size_t n, const Entry& e) {
    if (!stack[base].isTensorList() || element_start[0] != 0) return false;
    const c10::List<at::Tensor> self = stack[base].toTensorList();
    const size_t count = self.size();
    if (count != e.more.size() + 1) return false;
    thread_local std::vector<std::pair<PyObject*, size_t>> owners;  // (storage, its element), by storage
    owners.clear();
    for (size_t i = 0; i < count; ++i) {
      const Output& o = i == 0 ? e : e.more[i - 1];
      // replaced whole: a base tensor, or all of its storage keyed as it (AsBase::kElement, whose operands must
      // broadcast to the element's own shape), of the output's shape
      const at::Tensor t = self.get(i);
      if (o.absent || element_views[i] || t.scalar_type() != o.scalar_type ||
          !same_sizes(rt.st_shape.get(element_storages[i]), o.sizes) ||
          (t.sizes() != c10::IntArrayRef(o.sizes) && !operands_broadcast(stack, base, n, i, t.sizes()))) {
        return false;
      }
      owners.emplace_back(element_storages[i], i);
    }
    std::sort(owners.begin(), owners.end());
    for (size_t i = 1; i < count; ++i) {
      if (owners[i].first == owners[i - 1].first) return false;  // two elements of `self` over one storage
    }
    auto owner = [](PyObject* storage) -> long {  // the element of `self` over `storage`, or -1
      auto it = std::lower_bound(owners.begin(), owners.end(), std::make_pair(storage, size_t{0}));
      return it != owners.end() && it->first == storage ? static_cast<long>(it->second) : -1;
    };
    for (size_t a = 1; a < n; ++a) {
      if (element_start[a] >= 0) {  // another list: element j may share only element j's storage
        const size_t start = static_cast<size_t>(element_start[a]);
        const c10::IValue& list = stack[base + a];
        const size_t end = start + (list.isTensorList() ? list.toTensorList().size() : list.toListRef().size());
        for (size_t j = start; j < end; ++j) {
          const long i = element_storages[j] == nullptr ? -1 : owner(element_storages[j]);
          if (i >= 0 && static_cast<size_t>(i) != j - start) return false;
        }
      } else if (storages_scratch[a] != nullptr && owner(storages_scratch[a]) >= 0) {
        return false;
      }
    }
    return true;
  }

  // Whether every tensor operand of element i of a foreach call (element i of each list after `self`, and each
  // tensor argument) broadcasts to `shape`.
  static bool operands_broadcast(const torch::jit::Stack& stack, size_t base, size_t n, size_t i,
                                 c10::IntArrayRef shape) {
    for (size_t a = 1; a < n; ++a) {
      const c10::IValue& v = stack[base + a];
      if (v.isTensorList() && !broadcasts_to(v.toTensorList().get(i), shape)) return false;
      if (v.isTensor() && !broadcasts_to(v.toTensor(), shape)) return false;
    }
    return true;
  }

  // `_to_copy` of a CPU tensor to a tpu device (`x.to("tpu")`, `torch.tensor(data, device="tpu")`, a batch moved
  // each step, a DynamicCache's empty start per layer): core_kernels.to_copy's host branch — the cast on the CPU,
  // then core_kernels.from_host — without the boxed fallback's and that kernel's frames (about 40% of such a
  // copy's host time). Not while anything watches the runtime's door (a profile, entry spans, allocation sources),
  // with a pending interrupt, or for a layout, pinned memory or memory format that kernel would have to judge: the
  // Python path, unchanged. A failure in from_host is its Python error, as on that path.
  bool host_copy(torch::jit::Stack& stack) const {
    // (self, *, dtype, layout, device, pin_memory, non_blocking, memory_format)
    const size_t base = stack.size() - 7;
    const c10::IValue& self_v = stack[base];
    const c10::IValue &dtype = stack[base + 1], &layout = stack[base + 2], &pin = stack[base + 4];
    const c10::IValue& format = stack[base + 6];
    const bool unpinned = pin.isNone() || (pin.isBool() && !pin.toBool());
    const bool strided =
        layout.isNone() || (layout.isInt() && static_cast<c10::Layout>(layout.toInt()) == c10::kStrided);
    if (!self_v.isTensor() || !(dtype.isNone() || dtype.isInt()) || !unpinned || !strided) return false;
    if (!format.isNone()) {
      if (!format.isInt()) return false;
      const auto f = static_cast<c10::MemoryFormat>(format.toInt());
      if (f != c10::MemoryFormat::Preserve && f != c10::MemoryFormat::Contiguous) return false;
    }
    const at::Tensor& self = self_v.toTensor();
    if (!self.defined() || self.device().type() != c10::DeviceType::CPU || self.layout() != c10::kStrided) return false;
    const long index = named_device(stack[base + 3]);
    if (index < 0 || PyList_GET_ITEM(rt.interrupt, 0) != Py_False || PyList_GET_SIZE(rt.recorders) != 0 ||
        PyList_GET_ITEM(rt.entry_spans, 0) != Py_None || flag(rt.track_alloc)) {
      return false;
    }
    at::Tensor src = dtype.isNone() ? self : self.to(static_cast<c10::ScalarType>(dtype.toInt()));
    OwnedRef host(THPVariable_Wrap(src));
    OwnedRef device(PyLong_FromLong(index));
    if (host.p == nullptr || device.p == nullptr) throw python_error();
    if (!lock_try_acquire(rt.lock)) return false;  // another thread is inside the runtime: the Python kernel waits
    OwnedRef out;
    {
      const LockHeld held;
      out.p = PyObject_CallFunctionObjArgs(rt.from_host, host.p, device.p, nullptr);
    }
    if (out.p == nullptr) throw python_error();
    torch::jit::drop(stack, 7);
    torch::jit::push(stack, THPVariable_Unpack(out.p));
    return true;
  }

  // Strict mode: a call seen before runs its executable here (run_strict); leaves the key in key_scratch when
  // the Python path may teach it one. Pending fused work (which the Python path syncs first), a pending interrupt,
  // another device or thread: the Python path. While a profile records, the call's op record (a cache hit, with
  // its line and stack) and its entry span are noted as executor._run_repeated's path notes them.
  bool try_run(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    if (PyList_GET_ITEM(rt.interrupt, 0) != Py_False) return false;
    if (has_pending()) return false;
    const bool profiling = PyList_GET_SIZE(rt.recorders) != 0;
    const double t0 = profiling || PyList_GET_ITEM(rt.entry_spans, 0) != Py_None ? monotonic() : 0.0;
    OwnedRef sources;  // (source, stack) while profiling: read before the key, which must meet no bytecode
    if (profiling) {
      sources.p = op_sources();
      if (sources.p == nullptr) sources.p = PyObject_CallOneArg(rt.op_sources, rt.zero);
      if (sources.p == nullptr) throw python_error();
    }
    const long device = call_device(op, *stack);
    if (!adopt_plain(op, *stack)) throw python_error();
    PyObject* spans = PyList_GET_ITEM(rt.entry_spans, 0);  // read after the bytecode above
    if (!build_key(op, *stack, key_scratch, arrays_scratch, storages_scratch, device, dynamic_)) {
      key_scratch.clear();
      return false;
    }
    for (const auto* arrays : {&arrays_scratch, &elements_scratch}) {
      for (PyObject* a : *arrays) {
        if (a != nullptr && Py_TYPE(a) != rt.array_type) {  // a placeholder: not a strict call
          key_scratch.clear();
          return false;
        }
      }
    }
    auto found = strict_.find(key_scratch);
    if (found == strict_.end()) return false;
    const Entry& e = *found->second;
    if (e.exec_device != device) return false;  // compiled for another device: jit's dispatch (Python)
    const size_t n = op.schema().arguments().size();
    const size_t base = stack->size() - n;
    OwnedRef write_to;  // an in-place op's self storage (held: the write may run bytecode)
    if (inplace_) {     // the usual update: a base `self` whose storage the result replaces whole
      const at::Tensor& self = (*stack)[base].toTensor();
      if (views_scratch[0] || self.scalar_type() != e.scalar_type || self.sizes() != c10::IntArrayRef(e.sizes) ||
          overlaps_self(n)) {
        key_scratch.clear();  // mutation.write_result's general case: the Python path
        return false;
      }
      write_to.p = Py_NewRef(storages_scratch[0]);
    }
    PyObject* alloc_source = Py_None;
    if (!inplace_ && flag(rt.track_alloc)) {
      alloc_source = user_source();
      if (alloc_source == nullptr) return false;  // a line Python has not seen yet
    }
    const bool outermost = spans != Py_None && !lock_owned();
    if (!lock_try_acquire(rt.lock)) return false;  // another thread is inside the runtime: the Python kernel waits
    OwnedRef out;
    {
      const LockHeld held;
      out.p = run_strict(e, *stack, base, arrays_scratch, alloc_source, write_to.p);
    }
    if (out.p == nullptr) {  // a TypeError: the Python path decides, and learns nothing new
      key_scratch.clear();
      return false;
    }
    return_result(stack, base, n, out.p);
    ++stats.ran;
    if (profiling || outermost) note_profiled(e, t0, sources.release(), outermost ? spans : nullptr, Py_True);
    return true;
  }

  // A view op's output: a tensor over its input's storage with the learned geometry, or a list of them for an op
  // with several (view_kernels.py's make_view_kernel). No pending work changes, so no lock.
  void make_view(const Entry& e, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    const size_t base = stack->size() - n;
    const at::Tensor& self = (*stack)[base].toTensor();
    PyObject* storage = storages_scratch[0];
    if (e.several_views) {
      c10::List<at::Tensor> outs;
      outs.reserve(e.parts.size());
      for (const auto& part : e.parts) outs.push_back(view_tensor(*part, self, storage));
      torch::jit::drop(*stack, n);
      torch::jit::push(stack, std::move(outs));
    } else {
      at::Tensor result = view_tensor(e, self, storage);
      torch::jit::drop(*stack, n);
      torch::jit::push(stack, std::move(result));
    }
    ++stats.recorded;
  }

  // A view output's dtype: its View's own where it casts, else its storage's (self's, or the dtype self's cast
  // reads: view_as_complex(view_as_real(x)) is x's dtype again). A tensor's dtype is always one of the two.
  static c10::ScalarType view_dtype(const Entry& e, const at::Tensor& self) {
    if (casts(e.view)) return cast_dtype(e.view, 1);
    PyObject* storage = nullptr;
    PyObject* view = nullptr;
    if (data_ref(self, &storage, &view) && casts(view)) return cast_dtype(view, 0);
    return self.scalar_type();
  }

  // One view output: a tensor over `storage` with `e`'s geometry (set on its TensorImpl where it is not the
  // contiguous one).
  static at::Tensor view_tensor(const Entry& e, const at::Tensor& self, PyObject* storage) {
    PyObject* out = make_tensor(rt.tensor_type, e.sizes, e.strides, view_dtype(e, self), self.device().index(),
                                storage, e.view);
    if (out == nullptr) throw python_error();
    at::Tensor result = THPVariable_Unpack(out);
    Py_DECREF(out);  // the TensorImpl keeps its Python object (and the attributes on it)
    if (e.reported) {
      const long nbytes = as_long(rt.st_nbytes.get(storage));
      set_geometry(result.unsafeGetTensorImpl(), e.sizes, e.view_stride, e.view_offset, static_cast<size_t>(nbytes));
    }
    return result;
  }

  // The call's arguments replaced by its result: `self` for an in-place op (its storage took the result),
  // else the output tensor `out` (borrowed).
  void return_result(torch::jit::Stack* stack, size_t base, size_t n, PyObject* out) const {
    if (list_in_) {  // a foreach update returns nothing
      torch::jit::drop(*stack, n);
    } else if (list_out_) {  // a foreach op: its outputs (a tuple here) as one list
      c10::List<at::Tensor> outs;
      outs.reserve(static_cast<size_t>(PyTuple_GET_SIZE(out)));
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(out); ++i) {
        outs.push_back(THPVariable_Unpack(PyTuple_GET_ITEM(out, i)));
      }
      torch::jit::drop(*stack, n);
      torch::jit::push(stack, std::move(outs));
    } else if (inplace_) {
      at::Tensor self = (*stack)[base].toTensor();
      torch::jit::drop(*stack, n);
      torch::jit::push(stack, std::move(self));
    } else if (PyTuple_Check(out)) {  // an op with several outputs
      torch::jit::drop(*stack, n);
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(out); ++i) {
        PyObject* t = PyTuple_GET_ITEM(out, i);
        torch::jit::push(stack, t == Py_None ? at::Tensor() : THPVariable_Unpack(t));
      }
    } else {
      torch::jit::drop(*stack, n);
      torch::jit::push(stack, THPVariable_Unpack(out));
    }
  }

  // growth.appended(result, old storage, d, n + k, k, sources): the append's result marked as grown in its
  // lineage, and its op event while a profile records (`sources`: the op's (source, stack), else null). Run with
  // the runtime's lock held, so an interrupt waits; a failure there is a Python error like any other.
  // True: a loop that appends without syncing ended an iteration there (growth._loop_step): the graph is cut.
  static bool mark_appended(PyObject* result, PyObject* old, const Append& a, PyObject* sources) {
    OwnedRef d(PyLong_FromLongLong(a.d));
    OwnedRef length(PyLong_FromLongLong(a.n + a.k));
    OwnedRef k(PyLong_FromLongLong(a.k));
    if (d.p == nullptr || length.p == nullptr || k.p == nullptr) throw python_error();
    PyObject* args[] = {result, old, d.p, length.p, k.p, sources != nullptr ? sources : Py_None};
    PyObject* r = PyObject_Vectorcall(rt.appended, args, 6, nullptr);
    if (r == nullptr) throw python_error();
    const bool cut = r == Py_True;
    Py_DECREF(r);
    return cut;
  }

  // growth.mark_grown(result, d, source): a result on fronts marked as grown along d, as bounded.grown marks it (in
  // the sequence of `source`, a reordered front's Storage, when not null). Run with the runtime's lock held, like
  // mark_appended.
  static void mark_grown(PyObject* result, int64_t d, PyObject* source) {
    OwnedRef dim(PyLong_FromLongLong(d));
    if (dim.p == nullptr) throw python_error();
    PyObject* args[] = {result, dim.p, source != nullptr ? source : Py_None};
    PyObject* r = PyObject_Vectorcall(rt.mark_grown, args, 3, nullptr);
    if (r == nullptr) throw python_error();
    Py_DECREF(r);
  }

  // fused.has_pending(): work recorded since the last sync
  static bool has_pending() {
    return PyDict_GET_SIZE(rt.pw_storages.get(rt.pending)) != 0 || PyList_GET_SIZE(rt.pw_extra.get(rt.pending)) != 0;
  }

  // Whether this thread holds fused.LOCK already (a call inside another entry point, which times it).
  static bool lock_owned() { return torchtpu::lock_owned(rt.lock); }

  // The op record a profile reads (none when `sources` is null): telemetry.record_op's fields (name, t, dur,
  // cache_hit — None for a recorded op, True for a strict call's executable — source, stack) noted in every open
  // recorder's op log (op_log.h); and the entry span (t0, now, flat) when `spans` is not null and no op record
  // was noted: the record's interval is the span's, and the profile's time split counts a span only where no
  // event covers it. Steals `sources`.
  static void note_profiled(const Entry& e, double t0, PyObject* sources, PyObject* spans,
                            PyObject* hit = Py_None) {
    const double t1 = monotonic();
    OwnedRef owned_sources(sources);
    bool noted = false;
    if (sources != nullptr) {
      for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rt.recorders); ++i) {
        if (log_op(PyList_GET_ITEM(rt.recorders, i), e.name, t0, t1 - t0, hit, PyTuple_GET_ITEM(sources, 0),
                   PyTuple_GET_ITEM(sources, 1)) < 0) {
          throw python_error();
        }
        noted = true;
      }
    }
    if (spans != nullptr && !noted) {
      OwnedRef start(PyFloat_FromDouble(t0));
      OwnedRef end(PyFloat_FromDouble(t1));
      if (start.p == nullptr || end.p == nullptr || PyList_Append(spans, start.p) < 0 ||
          PyList_Append(spans, end.p) < 0) {
        throw python_error();
      }
    }
    // the profile's look at the program runs it is timing (program_cost.poll: never raises, but a hook that
    // did must not fail the op it follows)
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rt.after_entry); ++i) {
      OwnedRef hook(Py_NewRef(PyList_GET_ITEM(rt.after_entry, i)));
      PyObject* r = PyObject_CallNoArgs(hook.p);
      if (r == nullptr) PyErr_WriteUnraisable(hook.p);
      Py_XDECREF(r);
    }
  }

  // fused.over_limit()'s cheap half: at the size limit, at an op that ends a remembered cut point, or after an
  // append that ended a loop's iteration (`loop_cut`); the Python side decides and syncs (this may raise, like
  // any sync).
  static void flush_if_needed(const Entry& e, bool loop_cut) {
    const long recorded = as_long(rt.pw_recorded.get(rt.pending));
    const long limit = as_long(rt.state_value.get(rt.max_ops));
    PyObject* last_ids = rt.cut_last_ids.get(rt.cuts);
    bool maybe = loop_cut || recorded >= limit;
    if (!maybe && PySet_GET_SIZE(last_ids) != 0) {
      int has = PySet_Contains(last_ids, e.fn_id);
      if (has < 0) throw python_error();
      maybe = has == 1;
    }
    if (!maybe) return;
    PyObject* r = PyObject_CallNoArgs(rt.flush);
    if (r == nullptr) throw python_error();
    Py_DECREF(r);
  }

  std::string name_, overload_;
  uint64_t handed_ = 0;  // calls handed to the Python kernel
  PyObject* python_;  // the op's Python kernel (owned, never freed)
  bool view_;         // a view op: outputs share the input's storage, nothing is recorded
  bool inplace_;      // an in-place op: the functional op's node, written into self's storage
  bool list_in_;      // ... a foreach one: `self` a list, each element written with its output
  bool list_out_;     // a foreach op: its outputs returned as one list
  bool pointwise_;    // ... a pointwise one: a whole view's self is keyed and recorded as its storage
  bool appends_;      // aten::cat: also records growth.py's appends into spare capacity (as_append)
  bool attends_;      // aten::scaled_dot_product_attention: also records it on padded keys (as_padded_attention)
  bool on_fronts_;    // a pointwise op bounded.py rewrites: also records it on fronts (as_pointwise_fronts)
  bool copies_;       // aten::clone: on fronts only as bounded._copy rewrites it (padded_copy)
  bool selects_;      // aten::index_select: on a front across another dim, as bounded._select (as_first_front)
  bool rowwise_;      // linear, native_layer_norm: on a front grown along a leading dim, as bounded._rowwise
  bool transfers_;    // aten::_to_copy: also a CPU tensor's copy to a tpu device (host_copy)
  bool ranges_;       // aten::arange: also records it over a growing length's capacity (as_arange_front)
  std::string learns_, learns_overload_;
  std::vector<char> dynamic_;  // per argument: a number there is a graph input (keyed by type, see build_key)
  Table table_;
  Table strict_;  // strict mode's entries, under the same keys
  Table unsized_;  // length-free calls (fused mode), under as_append's or as_padded_attention's keys
};

void clear_entry(Entry& e) {
  for (PyObject* o : {e.compiled, e.signature, e.run, e.avals, e.treedef, e.name, e.uid, e.fn_id, e.shape,
                      e.aval_dtype, e.dtype, e.nbytes, e.view, e.call, e.checks, e.layout}) {
    Py_XDECREF(o);
  }
  for (const auto* outputs : {&e.more, &e.flags}) {
    for (const Output& o : *outputs) {
      for (PyObject* v : {o.shape, o.aval_dtype, o.dtype, o.nbytes, o.layout}) Py_XDECREF(v);
    }
  }
  for (auto& s : e.dyn) Py_XDECREF(s.constant);
  for (auto& part : e.parts) clear_entry(*part);
}

}  // namespace

void configure_recorder(PyObject* config) {
  TORCH_CHECK(PyDict_Check(config), "configure: a dict");
  rt.enabled = item(config, "enabled");
  rt.mode = item(config, "eager_mode");
  rt.track_sources = item(config, "track_sources");
  rt.track_alloc = item(config, "track_allocation_sources");
  rt.max_ops = item(config, "max_graph_ops");
  rt.recorders = item(config, "recorders");
  rt.entry_spans = item(config, "entry_spans");
  rt.after_entry = item(config, "after_entry");
  rt.interrupt = item(config, "interrupt_pending");
  rt.lock = item(config, "lock");
  TORCH_CHECK(is_lock(rt.lock), "torchtpu_lab recorder: fused.LOCK must be the native core's Lock ",
              "(native.reentrant_lock), not a ", Py_TYPE(rt.lock)->tp_name);
  rt.op_sources = item(config, "op_sources");
  rt.adopt = item(config, "adopt");
  rt.parameter_type = item(config, "Parameter");
  rt.set_array = item(config, "set_array");
  rt.partial = item(config, "partial");
  rt.note_later = item(config, "note_later");
  rt.from_host = item(config, "from_host");
  rt.acquire = item(config, "acquire");
  rt.release = item(config, "release");
  rt.counters = item(config, "counters");
  rt.pending = item(config, "pending");
  rt.cuts = item(config, "cuts");
  rt.flush = item(config, "flush");
  rt.internal_files = item(config, "internal_files");
  rt.sources = item(config, "sources");
  rt.backward = item(config, "backward");
  rt.grown_ids = item(config, "grown_ids");
  rt.appended = item(config, "appended");
  rt.mark_grown = item(config, "mark_grown");
  rt.bounded_active = item(config, "bounded_active");
  rt.bounded_native = item(config, "bounded_native");
  rt.lengths = item(config, "lengths");
  rt.recent_syncs = as_long(item(config, "recent_syncs"));
  rt.min_capacity = as_long(item(config, "min_capacity"));
  rt.main_thread = PyLong_AsUnsignedLong(PyDict_GetItemString(config, "main_thread"));
  if (PyErr_Occurred()) throw python_error();
  auto type = [&](const char* name) { return reinterpret_cast<PyTypeObject*>(item(config, name)); };
  rt.node_type = type("Node");
  rt.lazy_type = type("LazyValue");
  rt.storage_type = type("Storage");
  rt.tensor_type = type("TpuTensor");
  rt.array_type = type("ArrayImpl");
  rt.view_type = type("View");
  PyObject* state_type = reinterpret_cast<PyObject*>(Py_TYPE(rt.mode));
  rt.state_value = slot_of(state_type, "value");
  PyObject* pw = reinterpret_cast<PyObject*>(Py_TYPE(rt.pending));
  rt.pw_storages = slot_of(pw, "storages");
  rt.pw_prior = slot_of(pw, "prior");
  rt.pw_recorded = slot_of(pw, "recorded");
  rt.pw_seq = slot_of(pw, "seq");
  rt.pw_segment = slot_of(pw, "segment");
  rt.pw_device = slot_of(pw, "device");
  rt.pw_extra = slot_of(pw, "extra");
  PyObject* seg = reinterpret_cast<PyObject*>(Py_TYPE(rt.pw_segment.get(rt.pending)));
  rt.seg_token = slot_of(seg, "token");
  rt.seg_refs = slot_of(seg, "refs");
  rt.seg_node_keys = slot_of(seg, "node_keys");
  rt.seg_leaves = slot_of(seg, "leaves");
  rt.seg_leaf_sigs = slot_of(seg, "leaf_sigs");
  rt.seg_leaf_pos = slot_of(seg, "leaf_pos");
  rt.seg_regular = slot_of(seg, "regular");
  rt.seg_expect = slot_of(seg, "expect");
  rt.seg_matching = slot_of(seg, "matching");
  rt.seg_plans = slot_of(seg, "plans");
  rt.seg_fallback = slot_of(seg, "fallback");
  PyObject* cut = reinterpret_cast<PyObject*>(Py_TYPE(rt.cuts));
  rt.cut_tail = slot_of(cut, "tail");
  rt.cut_last_ids = slot_of(cut, "last_ids");
  PyObject* node = reinterpret_cast<PyObject*>(rt.node_type);
  rt.n_key = slot_of(node, "key");
  rt.n_uid = slot_of(node, "uid");
  rt.n_fn = slot_of(node, "fn");
  rt.n_inputs = slot_of(node, "inputs");
  rt.n_treedef = slot_of(node, "treedef");
  rt.n_avals = slot_of(node, "avals");
  rt.n_name = slot_of(node, "name");
  rt.n_source = slot_of(node, "source");
  rt.n_seq = slot_of(node, "seq");
  rt.n_segment = slot_of(node, "segment");
  rt.n_position = slot_of(node, "position");
  PyObject* lazy = reinterpret_cast<PyObject*>(rt.lazy_type);
  rt.lv_node = slot_of(lazy, "node");
  rt.lv_index = slot_of(lazy, "index");
  rt.lv_shape = slot_of(lazy, "shape");
  rt.lv_dtype = slot_of(lazy, "dtype");
  rt.lv_value = slot_of(lazy, "value");
  PyObject* st = reinterpret_cast<PyObject*>(rt.storage_type);
  rt.st_array = slot_of(st, "_array");
  rt.st_shape = slot_of(st, "shape");
  rt.st_dtype = slot_of(st, "dtype");
  rt.st_device = slot_of(st, "device_index");
  rt.st_nbytes = slot_of(st, "nbytes");
  rt.st_source = slot_of(st, "source");
  rt.fused_str = PyUnicode_InternFromString("fused");
  rt.strict_str = PyUnicode_InternFromString("strict");
  rt.hits_key = PyUnicode_InternFromString("op_cache_hits");
  rt.syncs_key = PyUnicode_InternFromString("syncs");
  rt.one = PyLong_FromLong(1);
  rt.zero = PyLong_FromLong(0);
  rt.minus_one = PyLong_FromLong(-1);
  rt.s_tpu_storage = PyUnicode_InternFromString("tpu_storage");
  rt.s_tpu_view = PyUnicode_InternFromString("tpu_view");
  rt.s_shape = PyUnicode_InternFromString("shape");
  rt.s_dtype = PyUnicode_InternFromString("dtype");
  rt.s_append = PyUnicode_InternFromString("append");
  rt.ready = true;
}

namespace {
std::vector<int64_t> ints_of(PyObject* seq);
}  // namespace

void install_recording_kernels(PyObject* ops) {
  // one Library for the process's life: its registrations must outlive every call
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__,
                                        __LINE__);
  PyObject* seq = PySequence_Fast(
      ops, "install_recording_kernels: a sequence of (name, overload, kernel, kind, learns, learns_overload, "
      "a 0/1 flag per argument: a number there is a graph input)");
  if (seq == nullptr) throw python_error();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* entry = PySequence_Fast_GET_ITEM(seq, i);
    const char* name = nullptr;
    const char* overload = nullptr;
    PyObject* fn = nullptr;
    int kind = 0;
    const char* learns = nullptr;
    const char* learns_overload = nullptr;
    PyObject* dynamic_indices = nullptr;
    if (!PyArg_ParseTuple(entry, "ssOissO", &name, &overload, &fn, &kind, &learns, &learns_overload,
                          &dynamic_indices)) {
      Py_DECREF(seq);
      throw python_error();
    }
    std::vector<char> dynamic;
    try {
      for (int64_t flag : ints_of(dynamic_indices)) dynamic.push_back(flag != 0);
    } catch (...) {
      Py_DECREF(seq);
      throw;
    }
    Py_INCREF(fn);
    TORCH_CHECK(kind >= 0 && kind <= 6, "install_recording_kernels: kind ", kind);
    auto kernel = std::make_unique<RecordingKernel>(name, overload, fn, static_cast<Kind>(kind), learns,
                                                    learns_overload, std::move(dynamic));
    kernels.push_back(kernel.get());
    std::string qualified = std::string(name).substr(std::strlen("aten::"));
    if (*overload) qualified += std::string(".") + overload;
    lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::move(kernel)));
  }
  Py_DECREF(seq);
}

bool lesson_pending() { return !misses.empty() && !misses.back().key.empty(); }

namespace {

// The innermost fallback call, if it is one of op name.overload with a key, else nullptr.
Miss* lesson_for(PyObject* name, PyObject* overload, bool view) {
  if (misses.empty() || misses.back().key.empty()) return nullptr;
  Miss& miss = misses.back();
  const char* n = PyUnicode_AsUTF8(name);
  const char* o = PyUnicode_AsUTF8(overload);
  if (n == nullptr || o == nullptr) throw python_error();
  if (!miss.kernel->learns(n, o) || miss.kernel->is_view() != view) return nullptr;  // another op's kernel
  if (miss.unsized != Unsized::kNo) return nullptr;  // a length-free key: learn_unsized teaches it
  return &miss;
}

void file(Table& table, const std::string& key, std::unique_ptr<Entry> e) {
  if (table.size() >= kMaxEntriesPerOp) {
    for (auto& kv : table) clear_entry(*kv.second);
    table.clear();
  }
  auto& slot = table[key];
  if (slot) clear_entry(*slot);
  slot = std::move(e);
  ++stats.learned;
}

// PyTorch's contiguous strides of `sizes` (device/views.py's contiguous_strides).
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (int64_t i = static_cast<int64_t>(sizes.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * std::max<int64_t>(sizes[i + 1], 1);
  }
  return strides;
}

std::vector<int64_t> ints_of(PyObject* seq) {
  PyObject* fast = PySequence_Fast(seq, "a sequence of ints");
  if (fast == nullptr) throw python_error();
  std::vector<int64_t> out;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      throw python_error();
    }
    out.push_back(v);
  }
  Py_DECREF(fast);
  return out;
}

}  // namespace

namespace {

// A view entry of the output geometry (view, size, stride, offset, reported) learn_view's arguments describe.
std::unique_ptr<Entry> view_entry(PyObject* view, PyObject* size, PyObject* stride, long offset, bool reported) {
  auto e = std::make_unique<Entry>();
  e->view = Py_NewRef(view);
  e->sizes = ints_of(size);
  e->strides = contiguous_strides(e->sizes);
  e->view_stride = ints_of(stride);
  e->view_offset = offset;
  e->reported = reported;
  TORCH_CHECK(e->view_stride.size() == e->sizes.size(), "learn_view: one stride per size");
  return e;
}

}  // namespace

bool learn_view(PyObject* name, PyObject* overload, PyObject* view, PyObject* size, PyObject* stride,
                long offset, bool reported) {
  Miss* miss = lesson_for(name, overload, true);
  if (miss == nullptr) return false;
  file(miss->kernel->table(), miss->key, view_entry(view, size, stride, offset, reported));
  return true;
}

bool learn_views(PyObject* name, PyObject* overload, PyObject* outputs) {
  Miss* miss = lesson_for(name, overload, true);
  if (miss == nullptr) return false;
  TORCH_CHECK(PyList_Check(outputs), "learn_views: a list of (view, size, stride, offset, reported)");
  auto e = std::make_unique<Entry>();
  e->several_views = true;  // (an unbind of a zero-size dim has no parts)
  try {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(outputs); ++i) {
      PyObject* o = PyList_GET_ITEM(outputs, i);
      TORCH_CHECK(PyTuple_Check(o) && PyTuple_GET_SIZE(o) == 5, "learn_views: (view, size, stride, offset, reported)");
      const long offset = as_long(PyTuple_GET_ITEM(o, 3));
      e->parts.push_back(view_entry(PyTuple_GET_ITEM(o, 0), PyTuple_GET_ITEM(o, 1), PyTuple_GET_ITEM(o, 2), offset,
                                    PyObject_IsTrue(PyTuple_GET_ITEM(o, 4)) == 1));
    }
  } catch (...) {
    clear_entry(*e);  // the parts made so far hold references
    throw;
  }
  file(miss->kernel->table(), miss->key, std::move(e));
  return true;
}

namespace {

PyObject* attr(PyObject* obj, const char* a) {
  PyObject* v = PyObject_GetAttrString(obj, a);
  if (v == nullptr) throw python_error();
  return v;
}

// The output's shape (a tuple of ints) and torch dtype (both stolen; nullptr: a Python error), its sizes, strides
// and bytes.
void set_output(Output& e, PyObject* shape, PyObject* dtype) {
  e.shape = shape;
  e.dtype = dtype;
  if (shape == nullptr || dtype == nullptr) throw python_error();
  TORCH_CHECK(THPDtype_Check(e.dtype), "learn: the output's dtype is not a torch.dtype");
  e.scalar_type = reinterpret_cast<THPDtype*>(e.dtype)->scalar_type;
  int64_t numel = 1;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(e.shape); ++i) {
    e.sizes.push_back(as_long(PyTuple_GET_ITEM(e.shape, i)));
    numel *= e.sizes.back();
  }
  e.strides = contiguous_strides(e.sizes);
  e.nbytes = PyLong_FromLongLong(numel * static_cast<int64_t>(c10::elementSize(e.scalar_type)));
  if (e.nbytes == nullptr) throw python_error();
}

// Output o laid out as `view` (a layouts.View: size, stride, offset 0) of its storage: the sizes and strides its
// tensor reports.
void set_layout(Output& o, PyObject* view) {
  TORCH_CHECK(PyTuple_Check(view) && PyTuple_GET_SIZE(view) >= 2, "learn: an output's layout is not a View");
  std::vector<int64_t> sizes, strides;
  for (auto [field, into] : {std::make_pair(0, &sizes), std::make_pair(1, &strides)}) {
    PyObject* values = PyTuple_GET_ITEM(view, field);
    TORCH_CHECK(PyTuple_Check(values), "learn: a layout's sizes and strides are tuples");
    for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(values); ++d) into->push_back(as_long(PyTuple_GET_ITEM(values, d)));
  }
  o.sizes = std::move(sizes);
  o.strides = std::move(strides);
  o.layout = Py_NewRef(view);
}

// Where each of the executable's dynamic inputs `dyn` comes from (`sources`: an argument position, -1 for the
// constant in dyn, kLength for an append's length); false where a constant is not one the key fixes (an array, a
// view's offset).
bool set_sources(Entry& e, PyObject* dyn, PyObject* sources) {
  const Py_ssize_t k = PyList_Size(dyn);
  TORCH_CHECK(k >= 0 && PySequence_Size(sources) == k, "learn: one source per dynamic input");
  for (Py_ssize_t j = 0; j < k; ++j) {
    PyObject* s = PySequence_GetItem(sources, j);
    if (s == nullptr) throw python_error();
    long position = -1;
    long element = -1;  // (position, element): an element of the tensor list at position
    const bool ok = PyTuple_Check(s) ? PyArg_ParseTuple(s, "ll", &position, &element) != 0
                                     : ((position = PyLong_AsLong(s)) != -1 || !PyErr_Occurred());
    Py_DECREF(s);
    if (!ok) throw python_error();
    PyObject* constant = nullptr;
    if (position < 0 && position != kLength) {
      constant = PyList_GET_ITEM(dyn, j);
      if (Py_TYPE(constant) != rt.array_type && !PyLong_CheckExact(constant)) return false;
      Py_INCREF(constant);
    }
    e.dyn.push_back({static_cast<int>(position), constant, static_cast<int>(element)});
  }
  return true;
}

}  // namespace

namespace {

// A new entry made by `fill`, with where its dynamic inputs come from, filed in `table` under the key of the
// call the Python path is teaching; false (nothing filed) where a source cannot be described.
template <typename Fill>
bool file_new(Miss* miss, Table& table, PyObject* dyn, PyObject* sources, Fill fill) {
  auto e = std::make_unique<Entry>();
  try {
    fill(*e);
    if (!set_sources(*e, dyn, sources)) {
      clear_entry(*e);
      return false;
    }
  } catch (...) {
    clear_entry(*e);
    throw;
  }
  file(table, miss->key, std::move(e));
  return true;
}

}  // namespace

namespace {

// An entry for the executor's OpExecutable `compiled`: its node's parts and its outputs (and error flags).
void fill_entry(Entry& e, PyObject* compiled) {
  e.compiled = Py_NewRef(compiled);
  e.signature = attr(compiled, "signature");
  e.run = attr(compiled, "run");
  e.avals = attr(compiled, "avals");
  e.treedef = attr(compiled, "treedef");
  e.name = attr(compiled, "name");
  e.uid = attr(compiled, "uid");
  e.fn_id = PyLong_FromVoidPtr(e.run);
  if (e.fn_id == nullptr) throw python_error();
  // the meta: a tensor, or one per output, None where the call's mask leaves one out (the executor checked:
  // the present ones are the avals, in order)
  OwnedRef meta(attr(compiled, "meta"));
  OwnedRef layout(attr(compiled, "layout"));  // None, a View, or one View or None per output (a list)
  const bool several = PyTuple_Check(meta.p) || PyList_Check(meta.p);
  const Py_ssize_t k = several ? PySequence_Size(meta.p) : 1;
  Py_ssize_t leaf = 0;
  for (Py_ssize_t i = 0; i < k; ++i) {
    OwnedRef m(several ? PySequence_GetItem(meta.p, i) : Py_NewRef(meta.p));
    if (m.p == nullptr) throw python_error();
    Output& o = i == 0 ? e : e.more.emplace_back();
    if (m.p == Py_None) {
      o.absent = true;
      continue;
    }
    PyObject* aval = PyList_GetItem(e.avals, leaf++);  // borrowed
    if (aval == nullptr) throw python_error();
    PyObject* shape = attr(aval, "shape");
    PyObject* tuple = PySequence_Tuple(shape);  // LazyValue keeps tuple(shape)
    Py_DECREF(shape);
    o.aval_dtype = PyObject_GetAttrString(aval, "dtype");
    set_output(o, tuple, o.aval_dtype == nullptr ? nullptr : PyObject_GetAttrString(m.p, "dtype"));
    PyObject* view = PyList_Check(layout.p) ? PyList_GetItem(layout.p, i) : layout.p;  // borrowed
    if (view == nullptr) throw python_error();
    if (view != Py_None) {
      set_layout(o, view);
      e.laid_out = true;
    }
  }
  OwnedRef checks(attr(compiled, "checks"));
  const Py_ssize_t leaves = PyList_Size(e.avals);
  TORCH_CHECK(leaf == leaves || (checks.p != Py_None && leaf < leaves), "learn: ", PyUnicode_AsUTF8(e.name),
              " has ", leaves, " output leaves for ", leaf, " present outputs");
  if (checks.p != Py_None) {  // its error flags: the leaves after the outputs
    e.checks = checks.release();
    for (; leaf < leaves; ++leaf) {
      Output& f = e.flags.emplace_back();
      PyObject* aval = PyList_GET_ITEM(e.avals, leaf);  // borrowed
      OwnedRef shape(attr(aval, "shape"));
      f.shape = PySequence_Tuple(shape.p);
      if (f.shape == nullptr) throw python_error();
      f.aval_dtype = attr(aval, "dtype");
    }
  }
}

}  // namespace

namespace {
// fill_entry, with `signature` (if any) as the node's key in place of `compiled`'s own: a program several
// signatures share (lengths, matmul precisions) is recorded under the call's.
void fill_entry_as(Entry& e, PyObject* compiled, PyObject* signature) {
  fill_entry(e, compiled);
  if (signature == nullptr) return;
  Py_XDECREF(e.signature);
  e.signature = Py_NewRef(signature);
}
}  // namespace

bool learn(PyObject* name, PyObject* overload, PyObject* compiled, PyObject* dyn, PyObject* sources,
           PyObject* signature) {
  Miss* miss = lesson_for(name, overload, false);
  if (miss == nullptr) return false;
  return file_new(miss, miss->kernel->table(), dyn, sources,
                  [&](Entry& e) { fill_entry_as(e, compiled, signature); });
}

bool learn_unsized(char kind, PyObject* compiled, PyObject* signature, PyObject* dyn, PyObject* sources) {
  if (misses.empty() || static_cast<char>(misses.back().unsized) != kind || kind == 0 || misses.back().key.empty()) {
    return false;
  }
  Miss* miss = &misses.back();
  return file_new(miss, miss->kernel->unsized_table(), dyn, sources, [&](Entry& e) {
    fill_entry_as(e, compiled, signature);  // (its program is shared by lengths)
    TORCH_CHECK(e.more.empty() && e.flags.empty(), "learn_unsized: a length-free call has one output");
  });
}

bool learn_strict(PyObject* name, PyObject* overload, PyObject* compiled, PyObject* call, long device,
                  PyObject* dyn, PyObject* sources) {
  Miss* miss = lesson_for(name, overload, false);
  if (miss == nullptr) return false;
  return file_new(miss, miss->kernel->strict_table(), dyn, sources, [&](Entry& e) {
    e.call = Py_NewRef(call);
    e.exec_device = device;
    e.name = attr(compiled, "name");
    PyObject* meta = attr(compiled, "meta");
    PyObject* shape = PyObject_GetAttrString(meta, "shape");
    PyObject* tuple = shape == nullptr ? nullptr : PySequence_Tuple(shape);  // Storage.shape: a tuple of ints
    Py_XDECREF(shape);
    PyObject* dtype = PyObject_GetAttrString(meta, "dtype");
    Py_DECREF(meta);
    if (tuple == nullptr || dtype == nullptr) {
      Py_XDECREF(tuple);
      Py_XDECREF(dtype);
      throw python_error();
    }
    set_output(e, tuple, dtype);
  });
}

void clear_recorded() {
  for (RecordingKernel* k : kernels) {
    for (Table* t : {&k->table(), &k->strict_table(), &k->unsized_table()}) {
      for (auto& kv : *t) clear_entry(*kv.second);
      t->clear();
    }
  }
}

namespace {
// nullptr, with the Python error a C++ exception stands for (a python_error's is set already).
PyObject* raised(const std::exception& e) {
  if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, e.what());
  return nullptr;
}
}  // namespace

PyObject* segment_add_py(PyObject* segment, PyObject* node) {
  if (!rt.ready || Py_TYPE(node) != rt.node_type) Py_RETURN_FALSE;
  PyObject* inputs = rt.n_inputs.get(node);
  if (inputs == nullptr || !PyList_CheckExact(inputs)) Py_RETURN_FALSE;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(inputs); ++i) {  // what segment_add keys; anything else: Python's
    PyTypeObject* t = Py_TYPE(PyList_GET_ITEM(inputs, i));
    if (t != rt.lazy_type && t != rt.array_type && t != &PyFloat_Type && t != &PyLong_Type && t != &PyBool_Type) {
      Py_RETURN_FALSE;
    }
  }
  try {
    segment_add(segment, node, inputs, rt.n_uid.get(node));
  } catch (const std::exception& e) {
    return raised(e);
  }
  Py_RETURN_TRUE;
}

PyObject* write_placeholders(PyObject* storages, PyObject* values) {
  if (!rt.ready || !PyList_CheckExact(storages) || !PyList_CheckExact(values) ||
      PyList_GET_SIZE(storages) != PyList_GET_SIZE(values)) {
    PyErr_SetString(PyExc_TypeError, "torchtpu_lab: write_placeholders takes two lists of equal length");
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(values); ++i) {
    if (Py_TYPE(PyList_GET_ITEM(values, i)) != rt.lazy_type ||
        Py_TYPE(PyList_GET_ITEM(storages, i)) != rt.storage_type) {
      PyErr_SetString(PyExc_TypeError, "torchtpu_lab: write_placeholders writes placeholders into Storages only");
      return nullptr;
    }
  }
  try {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(values); ++i) {
      write_placeholder(PyList_GET_ITEM(storages, i), PyList_GET_ITEM(values, i));
    }
  } catch (const std::exception& e) {
    return raised(e);
  }
  Py_RETURN_NONE;
}

PyObject* wrap_arrays(PyObject* arrays, PyObject* dtypes, PyObject* devices) {
  if (!rt.ready || !PyList_CheckExact(arrays) || !PyTuple_CheckExact(dtypes) || !PyTuple_CheckExact(devices) ||
      PyList_GET_SIZE(arrays) != PyTuple_GET_SIZE(dtypes) || PyTuple_GET_SIZE(dtypes) != PyTuple_GET_SIZE(devices)) {
    PyErr_SetString(PyExc_TypeError, "torchtpu_lab: wrap_arrays takes a list of arrays and tuples of their dtypes "
                                     "and devices, of equal length");
    return nullptr;
  }
  const Py_ssize_t n = PyList_GET_SIZE(arrays);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (Py_TYPE(PyList_GET_ITEM(arrays, i)) != rt.array_type || !THPDtype_Check(PyTuple_GET_ITEM(dtypes, i)) ||
        !PyLong_CheckExact(PyTuple_GET_ITEM(devices, i))) {
      PyErr_Format(PyExc_TypeError, "torchtpu_lab: wrap_arrays: output %zd is not a JAX array with a torch dtype "
                                    "and a device index", i);
      return nullptr;
    }
  }
  OwnedRef out(PyList_New(n));
  if (out.p == nullptr) return nullptr;
  try {
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* array = PyList_GET_ITEM(arrays, i);
      PyObject* dtype = PyTuple_GET_ITEM(dtypes, i);
      PyObject* device = PyTuple_GET_ITEM(devices, i);
      const c10::ScalarType scalar_type = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
      OwnedRef shape(PyObject_GetAttr(array, rt.s_shape));
      if (shape.p == nullptr) throw python_error();
      TORCH_CHECK(PyTuple_CheckExact(shape.p), "torchtpu_lab: wrap_arrays: an array's shape is not a tuple");
      std::vector<int64_t> sizes(static_cast<size_t>(PyTuple_GET_SIZE(shape.p)));
      int64_t numel = 1;
      for (size_t d = 0; d < sizes.size(); ++d) {
        sizes[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.p, static_cast<Py_ssize_t>(d)));
        if (sizes[d] == -1 && PyErr_Occurred()) throw python_error();
        numel *= sizes[d];
      }
      OwnedRef nbytes(PyLong_FromLongLong(numel * static_cast<int64_t>(c10::elementSize(scalar_type))));
      if (nbytes.p == nullptr) throw python_error();
      const long index = PyLong_AsLong(device);
      if (index == -1 && PyErr_Occurred()) throw python_error();
      PyList_SET_ITEM(out.p, i, array_tensor(array, shape.p, dtype, nbytes.p, scalar_type, sizes,
                                             contiguous_strides(sizes), index, Py_None));
    }
  } catch (const std::exception& e) {
    return raised(e);
  }
  return out.release();
}

PyObject* sync_targets() {
  if (!rt.ready) {
    PyErr_SetString(PyExc_RuntimeError, "torchtpu_lab: sync_targets before configure_recorder");
    return nullptr;
  }
  PyObject* pending = rt.pending;
  OwnedRef storages(PyList_New(0));
  OwnedRef held(PyList_New(0));
  if (storages.p == nullptr || held.p == nullptr) return nullptr;
  struct Target {
    long seq, index;
    PyObject* value;  // borrowed: held or extra keeps it
  };
  std::vector<Target> targets;  // each placeholder once: duplicates end up side by side once sorted
  auto want = [&](PyObject* v) -> bool {
    if (Py_TYPE(v) != rt.lazy_type) {
      PyErr_SetString(PyExc_TypeError, "torchtpu_lab: a sync's extra value is not a placeholder");
      return false;
    }
    PyObject* node = rt.lv_node.get(v);
    const long seq = PyLong_AsLong(rt.n_seq.get(node));
    const long index = PyLong_AsLong(rt.lv_index.get(v));
    if ((seq == -1 || index == -1) && PyErr_Occurred()) return false;
    targets.push_back({seq, index, v});
    return true;
  };
  PyObject* refs = rt.pw_storages.get(pending);
  Py_ssize_t pos = 0;
  PyObject* id;
  PyObject* ref;
  while (PyDict_Next(refs, &pos, &id, &ref)) {
    PyObject* storage = PyWeakref_GetObject(ref);  // borrowed; None once it is gone
    if (storage == Py_None) continue;
    PyObject* value = rt.st_array.get(storage);
    if (value == nullptr || Py_TYPE(value) != rt.lazy_type) continue;
    if (PyList_Append(storages.p, storage) < 0 || PyList_Append(held.p, value) < 0 || !want(value)) return nullptr;
  }
  PyObject* extra = rt.pw_extra.get(pending);
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(extra); ++i) {
    PyObject* values = PyTuple_GetItem(PyList_GET_ITEM(extra, i), 0);  // (values, callback)
    if (values == nullptr) return nullptr;
    OwnedRef seq(PySequence_Fast(values, "a sync's extra values"));
    if (seq.p == nullptr) return nullptr;
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(seq.p); ++j) {
      if (!want(PySequence_Fast_GET_ITEM(seq.p, j))) return nullptr;
    }
  }
  std::sort(targets.begin(), targets.end(), [](const Target& a, const Target& b) {
    return a.seq != b.seq ? a.seq < b.seq : (a.index != b.index ? a.index < b.index : a.value < b.value);
  });
  targets.erase(std::unique(targets.begin(), targets.end(),
                            [](const Target& a, const Target& b) { return a.value == b.value; }),
                targets.end());
  OwnedRef ordered(PyList_New(static_cast<Py_ssize_t>(targets.size())));
  if (ordered.p == nullptr) return nullptr;
  for (size_t i = 0; i < targets.size(); ++i) {
    PyList_SET_ITEM(ordered.p, static_cast<Py_ssize_t>(i), Py_NewRef(targets[i].value));
  }
  return PyTuple_Pack(3, storages.p, held.p, ordered.p);
}

PyObject* recorder_stats() {
  size_t entries = 0;
  for (RecordingKernel* k : kernels) entries += k->table().size() + k->strict_table().size();
  OwnedRef by_op(PyDict_New());  // which ops went to Python, and how often (what to move to C++ next)
  if (by_op.p == nullptr) throw python_error();
  for (RecordingKernel* k : kernels) {
    if (k->handed() == 0) continue;
    OwnedRef n(PyLong_FromUnsignedLongLong(k->handed()));
    if (n.p == nullptr || PyDict_SetItemString(by_op.p, k->qualified_name().c_str(), n.p) < 0) throw python_error();
  }
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:n,s:n,s:O}", "recorded", static_cast<unsigned long long>(stats.recorded),
                       "ran", static_cast<unsigned long long>(stats.ran),
                       "python", static_cast<unsigned long long>(stats.python), "learned",
                       static_cast<unsigned long long>(stats.learned), "entries", static_cast<Py_ssize_t>(entries),
                       "kernels", static_cast<Py_ssize_t>(kernels.size()), "python_ops", by_op.p);
}

}  // namespace torchtpu
