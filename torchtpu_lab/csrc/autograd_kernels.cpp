// The tpu device's AutogradPrivateUse1 kernels in C++.
//
// aten::linear's. backend/linear_grad.py says why the tpu device has its own: a weight's gradient must come out in
// the weight's [out, in] orientation, as a base tensor, or the fused step's program transposes every weight
// gradient. Its Python `_Linear` (an autograd.Function) costs ~50 us a call in the forward and as much again in the
// backward; a transformer's training step has a dozen linears, so here the same Function is a C++ one
// (torch::autograd::Function) and neither pass enters Python. What C++ does not serve — a functorch transform, a
// fake, functional or dual tensor, a complex or 1-D weight, an integer input — goes to linear_grad.py.
//
// aten::scaled_dot_product_attention's. runtime/padded_attention.py says why the device has its own (PyTorch would
// decompose the op before our kernel sees it). Here only its no-gradient call, a decode step's attention, once per
// layer and token: below autograd to the recording kernel, which records attention over padded keys (and over
// a static cache's whole buffers) without Python. Calls that need a gradient, and tensors that are not plain tpu
// ones, go to padded_attention.py's autograd_attention, which decides as before.
#include "autograd_kernels.h"

#include <memory>
#include <optional>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/linear.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <pybind11/cast.h>  // defines the pybind11 templates custom_function.h reaches (hidden visibility)
#include <pybind11/gil.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/library.h>

#include "recorder.h"

namespace torchtpu {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A tensor linear_grad.py's `_is_real` accepts (absent: an undefined bias): on the tpu device with its own data,
// not a fake, functional or functorch wrapper (those carry the Python, Functionalize or FuncTorch keys).
bool plain_tpu(const at::Tensor& t) {
  if (!t.defined()) return true;
  static const c10::DispatchKeySet wrappers({c10::DispatchKey::Python, c10::DispatchKey::Functionalize,
                                             c10::DispatchKey::FuncTorchGradWrapper,
                                             c10::DispatchKey::FuncTorchBatched,
                                             c10::DispatchKey::FuncTorchBatchedDecomposition,
                                             c10::DispatchKey::FuncTorchDynamicLayerBackMode,
                                             c10::DispatchKey::FuncTorchDynamicLayerFrontMode});
  return t.device().type() == c10::DeviceType::PrivateUse1 && !t.key_set().has_any(wrappers) &&
         !t._fw_grad(/*level=*/0).defined();  // a dual tensor: forward AD needs linear_grad.py's jvp
}

bool needs_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }

at::Tensor as_2d(const at::Tensor& t) { return t.dim() == 2 ? t : t.reshape({-1, t.size(-1)}); }

}  // namespace

// linear_grad.py's `_Linear`: y = x @ w.t() + b as one recorded op; the backward keeps every gradient in its
// input's orientation (grad_w = g.t().mm(x), [out, in], a base tensor), each computed only when asked for, from
// differentiable ops (so double backward works).
// Named outside the anonymous namespace: grad_fn.name() and autograd's errors print it
// (torch::autograd::CppNode<torchtpu::Linear>).
struct Linear : public torch::autograd::Function<Linear> {
  static constexpr bool is_traceable = true;  // plain aten ops, no state: compiled autograd may trace the backward

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const std::optional<at::Tensor>& b) {
    ctx->save_for_backward({x, w});
    if (b.has_value()) {  // its shape where it broadcast (e.g. [1, out]: its gradient is summed to it), else None
      const bool broadcast = b->dim() != 1 || b->size(0) != w.size(0);
      ctx->saved_data["bias"] = broadcast ? c10::IValue(b->sizes().vec()) : c10::IValue();
    }
    at::AutoDispatchBelowADInplaceOrView below;  // the tpu kernel: one recorded op
    return at::linear(x, w, b);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor g2 = as_2d(grads[0]);
    at::Tensor grad_x, grad_w, grad_b;
    if (ctx->needs_input_grad(0)) grad_x = g2.mm(w).reshape(x.sizes());
    if (ctx->needs_input_grad(1)) grad_w = g2.t().mm(as_2d(x));
    const auto bias = ctx->saved_data.find("bias");
    if (bias != ctx->saved_data.end() && ctx->needs_input_grad(2)) {
      grad_b = bias->second.isNone() ? g2.sum(0) : grads[0].sum_to_size(bias->second.toIntVector());
    }
    return {grad_x, grad_w, grad_b};
  }
};

namespace {

class LinearAutograd final : public c10::OperatorKernel {
 public:
  explicit LinearAutograd(PyObject* python) : python_(python) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const size_t n = stack->size();
    if (served(*stack)) {
      const at::Tensor x = (*stack)[n - 3].toTensor();
      const at::Tensor w = (*stack)[n - 2].toTensor();
      const c10::IValue& bias = (*stack)[n - 1];
      const bool has_bias = bias.isTensor() && bias.toTensor().defined();  // (an undefined tensor: no bias)
      const std::optional<at::Tensor> b = has_bias ? std::optional<at::Tensor>(bias.toTensor()) : std::nullopt;
      if (!(c10::GradMode::is_enabled() && (needs_grad(x) || needs_grad(w) || (b.has_value() && needs_grad(*b))))) {
        at::AutoDispatchBelowADInplaceOrView guard;  // no gradient: one recorded op, as linear_grad.linear sends it
        op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
        return;
      }
      at::Tensor y = Linear::apply(x, w, b);
      torch::jit::drop(*stack, 3);
      torch::jit::push(stack, std::move(y));
      return;
    }
    pybind11::gil_scoped_acquire gil;
    call_python_kernel(python_, op, stack);
  }

 private:
  // Plain tpu tensors, a floating input of 1 dim or more, a real 2-D weight, no functorch transform: the calls
  // linear_grad.linear runs as one op (below autograd) or through `_Linear`.
  static bool served(const torch::jit::Stack& stack) {
    const size_t n = stack.size();
    if (n < 3 || !stack[n - 3].isTensor() || !stack[n - 2].isTensor()) return false;
    const c10::IValue& bias = stack[n - 1];
    if (!bias.isNone() && !bias.isTensor()) return false;
    const at::Tensor& x = stack[n - 3].toTensor();
    const at::Tensor& w = stack[n - 2].toTensor();
    if (c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode)) return false;
    if (!plain_tpu(x) || !plain_tpu(w) || (bias.isTensor() && !plain_tpu(bias.toTensor()))) return false;
    return w.dim() == 2 && !w.is_complex() && x.dim() >= 1 && x.is_floating_point();
  }

  PyObject* python_;  // linear_grad.linear (a reference held for the process's life)
};

}  // namespace

namespace {

// aten::scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) at
// AutogradPrivateUse1: a call on plain tpu tensors (and no functorch transform) that needs no gradient goes below
// autograd, as padded_attention.autograd_attention sends it; everything else to that function.
class AttentionAutograd final : public c10::OperatorKernel {
 public:
  explicit AttentionAutograd(PyObject* python) : python_(python) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    if (below_autograd(*stack)) {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
      return;
    }
    pybind11::gil_scoped_acquire gil;
    call_python_kernel(python_, op, stack);
  }

 private:
  static bool below_autograd(const torch::jit::Stack& stack) {
    constexpr size_t kArguments = 8;
    if (stack.size() < kArguments) return false;
    const size_t base = stack.size() - kArguments;
    if (c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode)) return false;
    const bool grad = c10::GradMode::is_enabled();
    for (size_t i = 0; i < 4; ++i) {  // query, key, value, attn_mask (None or a tensor)
      const c10::IValue& v = stack[base + i];
      if (i == 3 && v.isNone()) continue;
      if (!v.isTensor() || !plain_tpu(v.toTensor()) || !v.toTensor().defined()) return false;
      if (grad && needs_grad(v.toTensor())) return false;
    }
    return true;
  }

  PyObject* python_;  // padded_attention.autograd_attention (a reference held for the process's life)
};

}  // namespace

void install_linear_autograd(PyObject* python) {
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradPrivateUse1,
                                        __FILE__, __LINE__);
  Py_INCREF(python);
  // grad_fn's Python type: named as linear_grad.py's Function's node (a tensor's repr shows it), not CppFunction
  static PyTypeObject node_type{};
  torch::autograd::_initFunctionPyTypeObject(node_type, "_LinearBackward", nullptr, nullptr);
  torch::autograd::registerCppFunction(typeid(torch::autograd::CppNode<Linear>), &node_type);
  lib->impl("linear", torch::CppFunction::makeFromBoxedFunctor(std::make_unique<LinearAutograd>(python)));
}

void install_attention_autograd(PyObject* python) {
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradPrivateUse1,
                                        __FILE__, __LINE__);
  Py_INCREF(python);
  lib->impl("scaled_dot_product_attention",
            torch::CppFunction::makeFromBoxedFunctor(std::make_unique<AttentionAutograd>(python)));
}

}  // namespace torchtpu
