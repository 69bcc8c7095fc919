// PyTorch gives a Python kernel (torch.library) its arguments as: positional arguments up to the first
// keyword-only one, less a tail of positional arguments equal to their defaults; keyword-only arguments as
// keywords, less those equal to their defaults; dtypes, layouts and memory formats as their Python objects. Our
// kernels (and their cache keys) were written against that, so the recording kernel's fallback gives them the
// same.
#include "python_kernel.h"

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

namespace torchtpu {
namespace {

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

}  // namespace torchtpu
