// The tpu devices as PyTorch's C++ sees them: how many, and which one is current on this thread.
#pragma once

#include <c10/core/Device.h>

namespace torchtpu {

// Number of tpu devices. Python hands it over once the JAX platform is known (never called from here: a C++
// callback must not run Python); before that it is 1.
c10::DeviceIndex device_count() noexcept;
void set_device_count(c10::DeviceIndex count);

// The device a bare "tpu" means on the calling thread (0 until set_current_device).
c10::DeviceIndex current_device() noexcept;
void set_current_device(c10::DeviceIndex index);

// Raises (a RuntimeError in Python, as CUDA's) unless 0 <= index < device_count().
void check_device(c10::DeviceIndex index);

// What waits for a device's pending work (torch.tpu.synchronize, through the bindings); may throw.
using SyncHook = void (*)(c10::DeviceIndex);
void set_sync_hook(SyncHook hook);

}  // namespace torchtpu
