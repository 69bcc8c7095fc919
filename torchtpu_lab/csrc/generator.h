// A tpu random generator: a seed and an offset, nothing else.
//
// Our random kernels are JAX functions of a key made *inside* the compiled program from (seed, offset), both
// program inputs: every draw advances the offset by one, so a fused step draws a fresh mask without recompiling
// and a generator with the same seed gives the same stream in every eager mode. The state is 16 bytes (seed,
// offset; each a little-endian 64-bit integer), a CPU uint8 tensor as CUDA's is.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace torchtpu {

class TpuGenerator final : public c10::GeneratorImpl {
 public:
  explicit TpuGenerator(c10::DeviceIndex index, uint64_t seed = 67280421310721ULL);

  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override;
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }
  void set_state(const c10::TensorImpl& state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

 private:
  TpuGenerator* clone_impl() const override;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The default generator of tpu:index (-1: the current device), made on first use.
const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);

}  // namespace torchtpu
