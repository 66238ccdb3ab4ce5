// NVML through dlopen: the few entry points frugal reads, declared here with NVML's C types
// (an int status, an opaque device handle), so no NVML header or link is needed.
#include "monitor/gpu_sensors.h"

#include <dlfcn.h>

#include <type_traits>

namespace frugal {

namespace {

using NvmlDevice = void*;
constexpr int kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1;
constexpr int kNvmlTemperatureGpu = 0;

struct ReasonName {
  uint64_t bit;
  const char* name;
  bool slows;  // a slowdown of a busy GPU (not idle, not a clock setting)
};
constexpr ReasonName kReasons[] = {{0x1, "idle", false},
                                   {0x2, "applications_clocks", false},
                                   {0x4, "sw_power_cap", true},
                                   {0x8, "hw_slowdown", true},
                                   {0x10, "sync_boost", true},
                                   {0x20, "sw_thermal", true},
                                   {0x40, "hw_thermal", true},
                                   {0x80, "hw_power_brake", true},
                                   {0x100, "display_clocks", false}};

}  // namespace

std::vector<std::string> throttle_reason_names(uint64_t bits) {
  std::vector<std::string> names;
  for (const ReasonName& r : kReasons)
    if ((bits & r.bit) && r.slows) names.push_back(r.name);
  return names;
}

bool is_throttling(uint64_t bits) { return !throttle_reason_names(bits).empty(); }

struct Nvml::Api {
  int (*init)();
  int (*shutdown)();
  int (*by_pci_bus_id)(const char*, NvmlDevice*);
  int (*clock)(NvmlDevice, int, unsigned*);
  int (*max_clock)(NvmlDevice, int, unsigned*);
  int (*temperature)(NvmlDevice, int, unsigned*);
  int (*power)(NvmlDevice, unsigned*);
  int (*power_limit)(NvmlDevice, unsigned*);
  int (*throttle)(NvmlDevice, unsigned long long*);
};

std::unique_ptr<Nvml> Nvml::load(std::string* why) {
  void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    if (why) *why = "libnvidia-ml.so.1 not found (no NVIDIA driver library)";
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  bool missing = false;
  auto find = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(library, name));
    if (!fn) missing = true;
  };
  find(api->init, "nvmlInit_v2");
  find(api->shutdown, "nvmlShutdown");
  find(api->by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2");
  find(api->clock, "nvmlDeviceGetClockInfo");
  find(api->max_clock, "nvmlDeviceGetMaxClockInfo");
  find(api->temperature, "nvmlDeviceGetTemperature");
  find(api->power, "nvmlDeviceGetPowerUsage");
  find(api->power_limit, "nvmlDeviceGetEnforcedPowerLimit");
  find(api->throttle, "nvmlDeviceGetCurrentClocksThrottleReasons");
  if (missing || api->init() != kNvmlSuccess) {
    if (why)
      *why = missing ? "libnvidia-ml.so.1 lacks an entry point frugal reads" : "nvmlInit failed";
    dlclose(library);
    return nullptr;
  }
  std::unique_ptr<Nvml> nvml(new Nvml());
  nvml->library_ = library;
  nvml->api_ = std::move(api);
  return nvml;
}

Nvml::~Nvml() {
  if (api_) api_->shutdown();
  if (library_) dlclose(library_);
}

bool Nvml::read(const std::string& pci_bus_id, GpuSensors& out) const {
  NvmlDevice device = nullptr;
  if (api_->by_pci_bus_id(pci_bus_id.c_str(), &device) != kNvmlSuccess) return false;
  unsigned milliwatts = 0, limit_milliwatts = 0;
  unsigned long long reasons = 0;
  // A field NVML cannot read on this GPU stays 0.
  api_->clock(device, kNvmlClockSm, &out.sm_clock_mhz);
  api_->max_clock(device, kNvmlClockSm, &out.max_sm_clock_mhz);
  api_->temperature(device, kNvmlTemperatureGpu, &out.temperature_c);
  if (api_->power(device, &milliwatts) == kNvmlSuccess) out.power_w = milliwatts / 1000.0;
  if (api_->power_limit(device, &limit_milliwatts) == kNvmlSuccess)
    out.power_limit_w = limit_milliwatts / 1000.0;
  if (api_->throttle(device, &reasons) == kNvmlSuccess) out.throttle_reasons = reasons;
  return true;
}

}  // namespace frugal
