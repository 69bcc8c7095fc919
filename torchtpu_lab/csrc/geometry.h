// A tpu tensor's torch-level geometry: the sizes, strides and storage offset PyTorch's view semantics give.
//
// Our data lives in JAX arrays (a storage and a view geometry, see torchtpu_lab/device/views.py); the TensorImpl
// only reports that geometry so stride(), storage_offset(), is_contiguous() and everything PyTorch decides from
// them (reshape's view-or-copy, autograd's CopySlices, Dynamo's fake copies) agree with CPU.
#pragma once

#include <c10/core/TensorImpl.h>
#include <c10/util/ArrayRef.h>

namespace torchtpu {

// Sets `impl`'s sizes, strides and storage offset in place; grows the recorded byte size of its storage (no
// allocation: a tpu storage's data pointer is a placeholder nothing reads) to `nbytes` if it is smaller.
void set_geometry(c10::TensorImpl* impl, c10::IntArrayRef size, c10::IntArrayRef stride, int64_t offset,
                  size_t nbytes);

}  // namespace torchtpu
