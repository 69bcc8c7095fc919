// PrivateUse1 hooks: what PyTorch asks of the tpu device beyond the guard (generators, pinned host memory,
// contexts). Registered once per process (PyTorch refuses a second registration), before anything registers
// Python hooks.
//
// Pinned memory: XLA copies from any host buffer, so "pinned" host memory is ordinary page-aligned host memory
// that we allocate and remember, which is what `is_pinned()` and DataLoader's pin-memory thread need. A pointer
// anywhere inside such a block is pinned (a slice of a pinned storage is, as on CUDA).
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>

#include "device.h"
#include "generator.h"

namespace torchtpu {
namespace {

class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* p = nullptr;
    if (n > 0) {
      TORCH_CHECK_WITH(OutOfMemoryError, posix_memalign(&p, kAlignment, n) == 0, "tpu: could not allocate ",
                       n, " bytes of pinned host memory");
      std::lock_guard<std::mutex> lock(mutex_);
      live_[reinterpret_cast<uintptr_t>(p)] = n;
    }
    return {p, p, &PinnedAllocator::release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &PinnedAllocator::release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  bool owns(const void* p) const {
    const auto at = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mutex_);
    auto block = live_.upper_bound(at);  // the first block starting after p; the one before may hold it
    if (block == live_.begin()) return false;
    --block;
    return at < block->first + block->second;
  }

  static PinnedAllocator& instance() {
    static PinnedAllocator allocator;
    return allocator;
  }

 private:
  static constexpr size_t kAlignment = 4096;
  static void release(void* p) {
    if (p == nullptr) return;
    {
      auto& self = instance();
      std::lock_guard<std::mutex> lock(self.mutex_);
      self.live_.erase(reinterpret_cast<uintptr_t>(p));
    }
    std::free(p);
  }
  mutable std::mutex mutex_;
  std::map<uintptr_t, size_t> live_;  // start -> size of each block handed out
};

struct TpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex index) const override { return index >= 0 && index < device_count(); }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  void setCurrentDevice(c10::DeviceIndex index) const override { set_current_device(index); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    auto old = current_device();
    if (index >= 0) set_current_device(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override { return exchangeDevice(index); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override { return new_generator(index); }
  // tpu storages point at no memory of ours (values live in XLA buffers): any pointer is on the current device
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return {c10::DeviceType::PrivateUse1, current_device()};
  }
  bool isPinnedPtr(const void* data) const override { return PinnedAllocator::instance().owns(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &PinnedAllocator::instance(); }
};

}  // namespace

void register_hooks() {
  static TpuHooks hooks;
  TORCH_CHECK(!at::isPrivateUse1HooksRegistered(),
              "PrivateUse1 hooks are already registered in this process (PyTorch accepts them once)");
  at::RegisterPrivateUse1HooksInterface(&hooks);
}

}  // namespace torchtpu
