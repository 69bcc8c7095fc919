#include "geometry.h"

#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

namespace torchtpu {

void set_geometry(c10::TensorImpl* impl, c10::IntArrayRef size, c10::IntArrayRef stride, int64_t offset,
                  size_t nbytes) {
  TORCH_CHECK(impl->device().type() == c10::DeviceType::PrivateUse1,
              "torchtpu_lab: set_geometry expects a tpu tensor, got one on ", impl->device());
  TORCH_CHECK(size.size() == stride.size(), "torchtpu_lab: set_geometry got ", size.size(), " sizes and ",
              stride.size(), " strides");
  TORCH_CHECK(offset >= 0, "torchtpu_lab: set_geometry got a negative storage offset ", offset);
  c10::StorageImpl* storage = impl->storage().unsafeGetStorageImpl();
  if (storage->nbytes() < nbytes) storage->set_nbytes(nbytes);
  impl->set_sizes_and_strides(size, stride, offset);
}

}  // namespace torchtpu
