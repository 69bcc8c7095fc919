// The PrivateUse1 device guard: what DeviceGuard, autograd's engine (one ready queue per device) and
// torch.Stream / torch.Event ask of the tpu device.
//
// XLA runs one device's programs in issue order and tracks buffer readiness itself, so each device has one
// stream (id 0) and ordering between streams already holds: `block` has nothing to do. An event records the
// host time at which it was recorded (`elapsedTime` is the time between two records) and how many non-blocking
// copies to the host were issued before it. Waiting for the device (synchronizeDevice/Stream:
// torch.accelerator.synchronize, torch.Stream.synchronize) runs the synchronize hook, torch.tpu.synchronize;
// an event's synchronize and query run the event hook, which lands the copies issued before the event (what the
// host can observe of the work before it; runtime/host_copies.py). Both hooks are set from the bindings. Those
// four are the only callbacks that enter Python: PyTorch calls them from Python bindings that pass a Python
// exception (a Ctrl-C) on; every noexcept callback stays in C++.
#include <atomic>
#include <chrono>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "device.h"

namespace torchtpu {
namespace {

constexpr auto kType = c10::DeviceType::PrivateUse1;

// The device's one stream; a device without an index (torch.Stream(device="tpu")) means the current one.
c10::Stream default_stream(c10::Device d) {
  return c10::Stream(c10::Stream::DEFAULT, d.index() < 0 ? c10::Device(kType, current_device()) : d);
}

struct Event {
  std::chrono::steady_clock::time_point when;
  c10::DeviceIndex device;
  uint64_t copies;  // host copies issued before the record
};

std::atomic<SyncHook> sync_hook{nullptr};
std::atomic<EventHook> event_hook{nullptr};
std::atomic<uint64_t> copies_issued{0};

void wait_for(c10::DeviceIndex index) {
  if (auto hook = sync_hook.load()) hook(index < 0 ? current_device() : index);
}

struct TpuGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return {kType, current_device()}; }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "tpu device guard got a ", d.type(), " device");
    if (d.index() >= 0) set_current_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < device_count()) {
      try {
        set_current_device(d.index());
      } catch (...) {
      }
    }
  }

  c10::Stream getStream(c10::Device d) const noexcept override { return default_stream(d); }
  c10::Stream getDefaultStream(c10::Device d) const override { return default_stream(d); }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override { return default_stream(d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high*/) const override {
    return default_stream(d);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return default_stream(s.device()); }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag /*flag*/) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "Event device index ",
                static_cast<int>(device_index), " does not match recording stream's device index ",
                static_cast<int>(stream.device_index()), ".");
    if (*event == nullptr) *event = new Event{};
    auto* e = static_cast<Event*>(*event);
    e->when = std::chrono::steady_clock::now();
    e->device = stream.device_index();
    e->copies = copies_issued.load();
  }
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* event) const override {
    auto hook = event_hook.load();
    if (event == nullptr || hook == nullptr) return true;
    auto* e = static_cast<Event*>(event);
    return hook(e->device, e->copies, false);
  }
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<Event*>(event);
  }
  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const c10::Stream& stream) const override { wait_for(stream.device_index()); }
  void synchronizeEvent(void* event) const override {
    if (event == nullptr) return;
    auto* e = static_cast<Event*>(event);
    if (auto hook = event_hook.load()) {
      hook(e->device, e->copies, true);
    } else {
      wait_for(e->device);
    }
  }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override { wait_for(device_index); }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(start && end, "Both events must be recorded before calculating elapsed time.");
    auto dt = static_cast<Event*>(end)->when - static_cast<Event*>(start)->when;
    return std::chrono::duration<double, std::milli>(dt).count();
  }
};

}  // namespace

void set_sync_hook(SyncHook hook) { sync_hook.store(hook); }
void set_event_hook(EventHook hook) { event_hook.store(hook); }
uint64_t issue_host_copy() noexcept { return copies_issued.fetch_add(1) + 1; }
uint64_t host_copies_issued() noexcept { return copies_issued.load(); }

void register_guard() {
  static TpuGuard guard;
  c10::impl::registerDeviceGuard(kType, &guard);
}

}  // namespace torchtpu
