// A GPU's clocks, temperature, power and throttle reasons from NVML, loaded at run time with
// dlopen("libnvidia-ml.so.1"): a machine without the driver's library still runs, with no
// sensors. Kernels know nothing of it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace frugal {

struct GpuSensors {
  unsigned sm_clock_mhz = 0;
  unsigned max_sm_clock_mhz = 0;
  unsigned temperature_c = 0;
  double power_w = 0;
  double power_limit_w = 0;
  uint64_t throttle_reasons = 0;  // NVML's clocks-event bits
};

// Names of the throttle reasons set in `bits` ("sw_thermal", "hw_power_brake", ...), idle and
// application-clock settings left out.
std::vector<std::string> throttle_reason_names(uint64_t bits);
// The reasons that slow a busy GPU down: power caps, thermal and hardware slowdowns, sync boost.
bool is_throttling(uint64_t bits);

class Nvml {
 public:
  // The library, initialised; null with `why` set when it cannot be loaded or initialised.
  static std::unique_ptr<Nvml> load(std::string* why);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // The sensors of the GPU at PCI bus id `pci_bus_id` ("0000:3B:00.0", what CUDA reports, so
  // that CUDA_VISIBLE_DEVICES does not matter); false when NVML cannot tell.
  bool read(const std::string& pci_bus_id, GpuSensors& out) const;

 private:
  struct Api;
  Nvml() = default;
  void* library_ = nullptr;
  std::unique_ptr<Api> api_;
};

}  // namespace frugal
