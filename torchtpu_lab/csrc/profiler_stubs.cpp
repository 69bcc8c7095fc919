// PyTorch's profiler stubs for the tpu device: what `torch.autograd.profiler.profile(use_device="tpu")` and
// `torch.profiler` (ProfilerActivity.PrivateUse1) ask of a PrivateUse1 backend to time an op's device side.
//
// Without them PyTorch's default stubs fail every record ("PrivateUse1 used in profiler but not enabled", once
// per op) and the profile reports garbage (negative totals). A tpu op is recorded, not run, when fused eager
// mode is on, so there is no per-op device time to read: as torch.Event on tpu (guard.cpp), a record is the host
// time it was made, and an op's "device" time is the host time between its two records. torchtpu_lab's own
// profiles (`%%tpu_profile`) time the device's programs. Every stub stays in C++ and cannot fail: synchronize
// has nothing to wait for (no record reads the device).
#include <chrono>
#include <memory>

#include <torch/csrc/profiler/stubs/base.h>

#include "device.h"

namespace torchtpu {
namespace {

using Clock = std::chrono::steady_clock;

struct TpuProfilerStubs final : torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    if (device != nullptr) *device = current_device();
    if (event != nullptr) *event = std::make_shared<Clock::time_point>(Clock::now());
    if (cpu_ns != nullptr) {
      *cpu_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
    }
  }
  // microseconds between two records, as CUDA's stubs report
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* event,
                const torch::profiler::impl::ProfilerVoidEventStub* event2) const override {
    if (event == nullptr || event2 == nullptr || !*event || !*event2) return 0.f;
    const auto& start = *static_cast<const Clock::time_point*>(event->get());
    const auto& end = *static_cast<const Clock::time_point*>(event2->get());
    return std::chrono::duration<float, std::micro>(end - start).count();
  }
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    const auto previous = current_device();
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      set_current_device(i);
      op(i);
    }
    set_current_device(previous);
  }
  void synchronize() const override {}
};

}  // namespace

void register_profiler_stubs() {
  static TpuProfilerStubs stubs;
  torch::profiler::impl::registerPrivateUse1Methods(&stubs);
}

}  // namespace torchtpu
