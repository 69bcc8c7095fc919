#include "device.h"

#include <atomic>

#include <c10/util/Exception.h>

namespace torchtpu {
namespace {
std::atomic<c10::DeviceIndex> count{1};
thread_local c10::DeviceIndex current = 0;
}  // namespace

c10::DeviceIndex device_count() noexcept { return count.load(std::memory_order_relaxed); }

void set_device_count(c10::DeviceIndex n) {
  TORCH_CHECK(n >= 1, "tpu: the platform must have at least one device, got ", static_cast<int>(n));
  count.store(n, std::memory_order_relaxed);
}

c10::DeviceIndex current_device() noexcept { return current; }

void check_device(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < device_count(), "Invalid device tpu:", static_cast<int>(index), ": there ",
              device_count() == 1 ? "is " : "are ", static_cast<int>(device_count()), " tpu device(s)");
}

void set_current_device(c10::DeviceIndex index) {
  check_device(index);
  current = index;
}

}  // namespace torchtpu
