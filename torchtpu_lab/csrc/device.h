// The tpu devices as PyTorch's C++ sees them: how many, and which one is current on this thread.
#pragma once

#include <cstdint>

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

// Non-blocking copies to the host are numbered as they are issued (runtime/host_copies.py takes the number
// here), so that an event, recorded in C++, knows which copies come before it.
uint64_t issue_host_copy() noexcept;
uint64_t host_copies_issued() noexcept;

// What an event's synchronize (wait = true) and query (wait = false) run, through the bindings: land the host
// copies numbered up to `upto` (waiting for the device where nothing is to land); returns whether they have all
// landed. May throw.
using EventHook = bool (*)(c10::DeviceIndex, uint64_t upto, bool wait);
void set_event_hook(EventHook hook);

}  // namespace torchtpu
