// The recording kernel (recorder.cpp): fused eager's common op recorded, and strict mode's repeated op run,
// without entering Python.
#pragma once

#include <Python.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace torchtpu {

// Hands the recorder the Python objects it reads and writes (fused.PENDING, the config states, the classes of
// the pending graph's objects, ...), by name in a dict; once, before install_recording_kernels.
void configure_recorder(PyObject* config);

// Registers a RecordingKernel as the PrivateUse1 kernel of each (schema name, overload, python kernel, kind,
// learns, learns_overload): kind 0 records a lowered op; 1, a view op, makes its output over the input's
// storage from a learned geometry; 2, an in-place op, records its functional op (`learns`, whose Python path
// teaches it) and writes the result into self's storage.
void install_recording_kernels(PyObject* ops);

// A boxed kernel's fallback to one of our Python kernels: pops the op's arguments off `stack`, calls `fn` with them
// as PyTorch's Python kernels (torch.library) receive them, and pushes its results. The GIL is held.
void call_python_kernel(PyObject* fn, const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Whether the innermost kernel call that fell back to Python has a key to learn under.
bool lesson_pending();

// Files `compiled` (an executor OpExecutable) under the key of the innermost fallback call of op
// name.overload; `sources`: per dynamic input, the argument position it comes from (-1: the constant in dyn).
// `signature`: the node's key where `compiled` is a program several signatures share (its own `signature` is
// then not the call's: runtime/padded_attention.py's), else nullptr.
bool learn(PyObject* name, PyObject* overload, PyObject* compiled, PyObject* dyn, PyObject* sources,
           PyObject* signature = nullptr);

// The same for a call keyed without its length n by the innermost fallback call, of `kind` 1 (an append into spare
// capacity, runtime/growth.py: aten::cat's key) or 2 (attention over padded keys, runtime/padded_attention.py:
// aten::scaled_dot_product_attention's): `compiled`, its program, recorded as a node keyed `signature`;
// `sources` as for learn, with -2 for n. False (nothing filed) when that call's key is not of `kind`.
bool learn_unsized(char kind, PyObject* compiled, PyObject* signature, PyObject* dyn, PyObject* sources);

// The same for strict mode: `call` runs `compiled`'s executable (compiled for tpu:`device`) on the dynamic inputs.
bool learn_strict(PyObject* name, PyObject* overload, PyObject* compiled, PyObject* call, long device,
                  PyObject* dyn, PyObject* sources);

// The same for a view op: the output's View (or None), size, the stride and offset its TensorImpl reports,
// and whether those differ from the contiguous ones (then they are set on it).
bool learn_view(PyObject* name, PyObject* overload, PyObject* view, PyObject* size, PyObject* stride, long offset,
                bool reported);

// The same for a view op with a list of outputs (split, unbind): `outputs`, a list of (view, size, stride, offset,
// reported), one per output in order.
bool learn_views(PyObject* name, PyObject* overload, PyObject* outputs);

// graph_key.Segment.add(node) for a node the Python path recorded: True when done here, False (nothing done) for
// inputs only Python's add keys (a FailedValue, another array type). nullptr with a Python error set.
PyObject* segment_add_py(PyObject* segment, PyObject* node);

// values.set_array(storage, placeholder) for each pair (lists of equal length; placeholders only), as the recorded
// path writes an in-place op's result. None, or nullptr with a Python error set.
PyObject* write_placeholders(PyObject* storages, PyObject* values);

// tensor.from_array for each of `arrays` (a list of JAX arrays) with torch dtype dtypes[i] on tpu:devices[i] (two
// tuples): a new base tensor over a new Storage holding the array, counted by the memory ledger (the outputs of a
// compiled graph). A list, or nullptr with a Python error set.
PyObject* wrap_arrays(PyObject* arrays, PyObject* dtypes, PyObject* devices);

// fused._sync's snapshot of the pending work: (the live storages holding a placeholder, those placeholders, the
// placeholders to compute: those and the extra values, each once, in recording order (node seq, then index)).
// A new reference, or nullptr with a Python error set.
PyObject* sync_targets();

void clear_recorded();
PyObject* recorder_stats();

}  // namespace torchtpu
