"""``torch.autocast("tpu", ...)``: CUDA's autocast casting policy on the ``AutocastPrivateUse1`` dispatch key.

PyTorch routes ops on ``tpu`` tensors through ``AutocastPrivateUse1`` while autocast is enabled for ``"tpu"`` but
registers nothing there, so every op would fail. :func:`install` registers a fallthrough for all ops and, for the
ops in CUDA's lists (``ATen/autocast_mode.h``: ``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``,
``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE``, ``AT_FORALL_PROMOTE``), a kernel that
casts the floating ``tpu`` tensor arguments the way CUDA's does and redispatches with the autocast key excluded.
The casts run above autograd, so backward sees them, as on CUDA.

Eligible tensors, as in PyTorch, are floating ``tpu`` tensors other than float64; CPU tensors and float64 tensors
are never cast. Unlike CUDA we keep no cache of casted weights (``cache_enabled`` is accepted and ignored): a
weight used twice in one region is cast twice, which gives the same values.
"""

from __future__ import annotations

import torch
from torch.library import Library, fallthrough_kernel

_DEVICE = "tpu"
_KEY_NAME = "AutocastPrivateUse1"
_KEYSET = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

# (op, overload) lists of CUDA's autocast policy, PyTorch 2.13 (ATen/autocast_mode.h).
LOWER_PRECISION_FP = [
    ("_convolution", "deprecated"), ("_convolution", "default"), ("conv1d", "default"), ("conv2d", "default"),
    ("conv3d", "default"), ("conv_tbc", "default"), ("conv_transpose1d", "default"), ("conv_transpose2d", "input"),
    ("conv_transpose3d", "input"), ("convolution", "default"), ("prelu", "default"), ("addmm", "default"),
    ("addmv", "default"), ("addr", "default"), ("matmul", "default"), ("einsum", "default"), ("mm", "default"),
    ("mv", "default"), ("linalg_vecdot", "default"), ("linear", "default"), ("addbmm", "default"),
    ("baddbmm", "default"), ("bmm", "default"), ("chain_matmul", "default"), ("linalg_multi_dot", "default"),
    ("_thnn_fused_lstm_cell", "default"), ("_thnn_fused_gru_cell", "default"), ("lstm_cell", "default"),
    ("gru_cell", "default"), ("rnn_tanh_cell", "default"), ("rnn_relu_cell", "default"),
    ("_scaled_dot_product_flash_attention", "default"), ("scaled_dot_product_attention", "default"),
]

FP32 = [
    ("acos", "default"), ("asin", "default"), ("cosh", "default"), ("erfinv", "default"), ("exp", "default"),
    ("expm1", "default"), ("log", "default"), ("log10", "default"), ("log2", "default"), ("log1p", "default"),
    ("reciprocal", "default"), ("rsqrt", "default"), ("sinh", "default"), ("tan", "default"),
    ("pow", "Tensor_Scalar"), ("pow", "Tensor_Tensor"), ("pow", "Scalar"), ("softplus", "default"),
    ("layer_norm", "default"), ("native_layer_norm", "default"), ("rms_norm", "default"), ("group_norm", "default"),
    ("frobenius_norm", "dim"), ("nuclear_norm", "default"), ("nuclear_norm", "dim"),
    ("cosine_similarity", "default"), ("poisson_nll_loss", "default"), ("cosine_embedding_loss", "default"),
    ("nll_loss", "default"), ("nll_loss2d", "default"), ("hinge_embedding_loss", "default"), ("kl_div", "default"),
    ("l1_loss", "default"), ("smooth_l1_loss", "default"), ("huber_loss", "default"), ("mse_loss", "default"),
    ("margin_ranking_loss", "default"), ("multilabel_margin_loss", "default"), ("soft_margin_loss", "default"),
    ("triplet_margin_loss", "default"), ("multi_margin_loss", "default"),
    ("binary_cross_entropy_with_logits", "default"), ("dist", "default"), ("pdist", "default"),
    ("cdist", "default"), ("renorm", "default"), ("logsumexp", "default"), ("upsample_nearest1d", "default"),
    ("_upsample_nearest_exact1d", "default"), ("upsample_nearest2d", "default"),
    ("_upsample_nearest_exact2d", "default"), ("upsample_nearest3d", "default"),
    ("_upsample_nearest_exact3d", "default"), ("upsample_linear1d", "default"),
    ("upsample_bilinear2d", "default"), ("_upsample_bilinear2d_aa", "default"),
    ("upsample_trilinear3d", "default"), ("upsample_bicubic2d", "default"), ("_upsample_bicubic2d_aa", "default"),
]

FP32_SET_OPT_DTYPE = [
    ("prod", "default"), ("prod", "dim_int"), ("softmax", "int"), ("log_softmax", "int"), ("cumprod", "default"),
    ("cumsum", "default"), ("linalg_vector_norm", "default"), ("linalg_matrix_norm", "default"),
    ("linalg_matrix_norm", "str_ord"), ("sum", "default"), ("sum", "dim_IntList"),
]

# Registered overload -> the overload with a dtype argument that it redispatches to.
FP32_APPEND_DTYPE = {
    ("norm", "Scalar"): ("norm", "ScalarOpt_dtype"),
    ("norm", "ScalarOpt_dim"): ("norm", "ScalarOpt_dim_dtype"),
}

PROMOTE = [
    ("addcdiv", "default"), ("addcmul", "default"), ("atan2", "default"), ("bilinear", "default"),
    ("cross", "default"), ("dot", "default"), ("vdot", "default"), ("grid_sampler", "default"),
    ("index_put", "default"), ("tensordot", "default"), ("scatter_add", "default"),
]

_BCE_BANNED = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast."
)


def _eligible(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == _DEVICE and x.is_floating_point() and (
        x.dtype != torch.float64
    )


def _cast(x, dtype):
    """PyTorch's ``cached_cast`` without the cache: eligible tensors (also inside lists) go to ``dtype``."""
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if _eligible(x) and x.dtype != dtype else x
    if isinstance(x, (list, tuple)) and any(isinstance(t, torch.Tensor) for t in x):
        return type(x)(_cast(t, dtype) for t in x)
    return x


def _cast_all(args, kwargs, dtype):
    return [_cast(a, dtype) for a in args], {k: _cast(v, dtype) for k, v in kwargs.items()}


def _tensors(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (t for t in a if isinstance(t, torch.Tensor))


def _promote_type(args, kwargs, lower):
    """PyTorch's ``promote_type``: float32 wins over the autocast dtype; float64 tensors are ignored."""
    current = lower
    for t in _tensors(args, kwargs):
        if not _eligible(t):
            continue
        if current == torch.float32 or t.dtype == torch.float32:
            current = torch.float32
        elif not (current == lower and t.dtype == lower):
            raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")
    return current


def _lower_precision_fp(op, args, kwargs):
    args, kwargs = _cast_all(args, kwargs, torch.get_autocast_dtype(_DEVICE))
    return op(*args, **kwargs)


def _fp32(op, args, kwargs):
    args, kwargs = _cast_all(args, kwargs, torch.float32)
    return op(*args, **kwargs)


def _promote(op, args, kwargs):
    args, kwargs = _cast_all(args, kwargs, _promote_type(args, kwargs, torch.get_autocast_dtype(_DEVICE)))
    return op(*args, **kwargs)


def _fill_positional(schema, args, upto):
    """``args`` extended with the schema's defaults through index ``upto``."""
    args = list(args)
    for a in schema.arguments[len(args):upto + 1]:
        args.append(a.default_value if a.has_default_value() else None)
    return args


def _set_opt_dtype(op, args, kwargs):
    """Run in float32 through the op's ``dtype`` argument when the first tensor is eligible and no dtype is given."""
    if not _eligible(args[0]):
        return op(*args, **kwargs)
    schema = op._schema
    index = next(i for i, a in enumerate(schema.arguments) if a.name == "dtype")
    if schema.arguments[index].kwarg_only:
        if kwargs.get("dtype") is None:
            kwargs = {**kwargs, "dtype": torch.float32}
    else:
        args = _fill_positional(schema, args, index)
        if args[index] is None:
            args[index] = torch.float32
    return op(*args, **kwargs)


def _append_dtype(target):
    """``norm`` without a dtype: redispatch to the overload with one, float32 for an eligible input."""

    def policy(op, args, kwargs):
        args = _fill_positional(op._schema, args, len(op._schema.arguments) - 1)
        dtype = torch.float32 if _eligible(args[0]) else args[0].dtype
        return target(*args, **kwargs, dtype=dtype)

    return policy


def _banned(op, args, kwargs):
    raise RuntimeError(_BCE_BANNED)


def _kernel(op, policy):
    def kernel(*args, **kwargs):
        # Checked before the guard: PyTorch reads "enabled" as "key not excluded".
        enabled = torch.is_autocast_enabled(_DEVICE)
        with torch._C._ExcludeDispatchKeyGuard(_KEYSET):
            return policy(op, args, kwargs) if enabled else op(*args, **kwargs)

    kernel.__name__ = f"autocast_{op.__name__.replace('.', '_')}"
    return kernel


def _overload(name, overload):
    packet = getattr(torch.ops.aten, name, None)
    return None if packet is None or overload not in packet.overloads() else getattr(packet, overload)


def policies():
    """``{OpOverload: policy function}`` for every op this torch has from CUDA's lists."""
    table = {}
    for entries, policy in ((LOWER_PRECISION_FP, _lower_precision_fp), (FP32, _fp32),
                            (FP32_SET_OPT_DTYPE, _set_opt_dtype), (PROMOTE, _promote)):
        for name, overload in entries:
            op = _overload(name, overload)
            if op is not None:
                table[op] = policy
    for (name, overload), (tname, toverload) in FP32_APPEND_DTYPE.items():
        op, target = _overload(name, overload), _overload(tname, toverload)
        if op is not None and target is not None:
            table[op] = _append_dtype(target)
    table[torch.ops.aten.binary_cross_entropy.default] = _banned
    return table


_libraries: list = []


def install() -> None:
    """Register the fallthrough and the casting kernels (idempotent)."""
    if _libraries:
        return
    if not torch._C._dispatch_has_backend_fallback(torch._C.DispatchKey.AutocastPrivateUse1):
        # PyTorch registers no fallback on the key for PrivateUse1: ops outside the lists must pass through.
        fallback = Library("_", "IMPL")
        fallback.fallback(fallthrough_kernel, _KEY_NAME)
        _libraries.append(fallback)
    # TPUs (and TorchTPU) compute in bfloat16 under autocast; PyTorch's default for a new device is float16
    torch.set_autocast_dtype(_DEVICE, torch.bfloat16)
    lib = Library("aten", "IMPL")
    for op, policy in policies().items():
        lib.impl(op, _kernel(op, policy), _KEY_NAME)
    _libraries.append(lib)


install()
