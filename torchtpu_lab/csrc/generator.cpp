#include "generator.h"

#include <cstring>
#include <deque>
#include <mutex>
#include <random>

#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include "device.h"

namespace torchtpu {

constexpr size_t kStateBytes = 16;

TpuGenerator::TpuGenerator(c10::DeviceIndex index, uint64_t seed)
    : c10::GeneratorImpl({c10::DeviceType::PrivateUse1, index},
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(seed) {}

void TpuGenerator::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

uint64_t TpuGenerator::seed() {
  // non-deterministic, as CUDA's Generator.seed(); 63 bits so that it round-trips through Python's int64 APIs
  std::random_device rd;
  uint64_t s = ((static_cast<uint64_t>(rd()) << 32) | rd()) & 0x7FFFFFFFFFFFFFFFULL;
  set_current_seed(s);
  return s;
}

void TpuGenerator::set_state(const c10::TensorImpl& state) {
  TORCH_CHECK_TYPE(state.device().is_cpu() && state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
                   "RNG state must be a torch.ByteTensor (a CPU uint8 tensor), got a ", state.dtype().name(),
                   " tensor on ", state.device());
  TORCH_CHECK(state.numel() == kStateBytes && state.is_contiguous(), "RNG state of a tpu generator must be ",
              kStateBytes, " contiguous bytes (from get_state), got ", state.numel());
  uint64_t words[2];
  std::memcpy(words, state.data(), kStateBytes);
  seed_ = words[0];
  offset_ = words[1];
}

c10::intrusive_ptr<c10::TensorImpl> TpuGenerator::get_state() const {
  c10::Storage storage(c10::Storage::use_byte_size_t(), kStateBytes, c10::GetCPUAllocator(), false);
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                   caffe2::TypeMeta::Make<uint8_t>());
  impl->set_sizes_contiguous({static_cast<int64_t>(kStateBytes)});
  uint64_t words[2] = {seed_, offset_};
  std::memcpy(impl->mutable_data(), words, kStateBytes);
  return impl;
}

TpuGenerator* TpuGenerator::clone_impl() const {
  auto* g = new TpuGenerator(device().index(), seed_);
  g->offset_ = offset_;
  return g;
}

const at::Generator& default_generator(c10::DeviceIndex index) {
  // a deque: references handed out stay valid while more devices are added
  static std::mutex mutex;
  static std::deque<at::Generator> generators;
  if (index == -1) index = current_device();
  check_device(index);
  std::lock_guard<std::mutex> lock(mutex);
  while (static_cast<c10::DeviceIndex>(generators.size()) <= index) {
    generators.push_back(at::make_generator<TpuGenerator>(static_cast<c10::DeviceIndex>(generators.size())));
  }
  return generators[index];
}

at::Generator new_generator(c10::DeviceIndex index) {
  if (index == -1) index = current_device();
  check_device(index);
  return at::make_generator<TpuGenerator>(index);
}

}  // namespace torchtpu
