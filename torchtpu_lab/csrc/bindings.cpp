// torchtpu_lab._C: the Python face of the native core (the one translation unit that includes pybind).
#include <pybind11/pybind11.h>
#include <torch/csrc/Generator.h>

#include "device.h"
#include "generator.h"

namespace torchtpu {
void register_guard();
void register_hooks();
}  // namespace torchtpu

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchtpu_lab's native core: the PrivateUse1 device guard, hooks, generators and pinned memory";
  m.def("register", [] {
    torchtpu::register_guard();
    torchtpu::register_hooks();
  }, "Register the tpu guard and hooks with PyTorch (once per process).");
  m.def("set_device_count", [](int n) { torchtpu::set_device_count(static_cast<c10::DeviceIndex>(n)); });
  m.def("device_count", [] { return static_cast<int>(torchtpu::device_count()); });
  m.def("current_device", [] { return static_cast<int>(torchtpu::current_device()); });
  m.def("set_current_device", [](int i) { torchtpu::set_current_device(static_cast<c10::DeviceIndex>(i)); });
  m.def("default_generator", [](int i) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_Wrap(torchtpu::default_generator(static_cast<c10::DeviceIndex>(i))));
  }, "The default torch.Generator of tpu:i.");
}
