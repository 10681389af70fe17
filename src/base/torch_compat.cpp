#include "base/torch_compat.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <dlfcn.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include "base/torch_profiler_compat.h"
#ifdef USE_C10D_NCCL  // a CUDA LibTorch
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace accelerant::detail {

// 2.4 renamed the per-device functions (set_cpu_enabled -> set_autocast_enabled(kCPU, ...)).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool autocast_enabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
void set_autocast_enabled(c10::DeviceType d, bool on) { at::autocast::set_autocast_enabled(d, on); }
c10::ScalarType autocast_dtype(c10::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
void set_autocast_dtype(c10::DeviceType d, c10::ScalarType t) {
  at::autocast::set_autocast_dtype(d, t);
}
#else
bool autocast_enabled(c10::DeviceType d) {
  return d == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
void set_autocast_enabled(c10::DeviceType d, bool on) {
  d == c10::DeviceType::CUDA ? at::autocast::set_enabled(on) : at::autocast::set_cpu_enabled(on);
}
c10::ScalarType autocast_dtype(c10::DeviceType d) {
  return d == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                    : at::autocast::get_autocast_cpu_dtype();
}
void set_autocast_dtype(c10::DeviceType d, c10::ScalarType t) {
  d == c10::DeviceType::CUDA ? at::autocast::set_autocast_gpu_dtype(t)
                             : at::autocast::set_autocast_cpu_dtype(t);
}
#endif

void enter_autocast() { at::autocast::increment_nesting(); }
void leave_autocast() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

namespace {

// A library of the NVIDIA driver, only if some part of this process loaded it already (RTLD_NOLOAD)
// or, with `load`, loaded now; closed when it goes.
struct DriverLibrary {
  void* handle;
  DriverLibrary(const char* name, bool load)
      : handle(::dlopen(name, RTLD_NOW | RTLD_LOCAL | (load ? 0 : RTLD_NOLOAD))) {}
  ~DriverLibrary() {
    if (handle != nullptr) ::dlclose(handle);
  }
  template <class F>
  F* function(const char* symbol) const {
    return handle == nullptr ? nullptr : reinterpret_cast<F*>(::dlsym(handle, symbol));
  }
};

}  // namespace

// Both questions are asked without initialising CUDA here: a process that called cuInit (which
// any CUDA runtime query does, torch::cuda::is_available() too) cannot fork workers that use CUDA
// (theirs fails with cudaErrorInitializationError; seen on an H200 with LibTorch 2.11). NVML
// counts the devices without touching CUDA, as PyTorch's own fork-safe device count does.
bool nvidia_gpu_present() {
#ifdef USE_C10D_NCCL
  DriverLibrary nvml("libnvidia-ml.so.1", /*load=*/true);
  auto init = nvml.function<int()>("nvmlInit_v2");
  auto count = nvml.function<int(unsigned*)>("nvmlDeviceGetCount_v2");
  auto shutdown = nvml.function<int()>("nvmlShutdown");
  if (init == nullptr || count == nullptr || shutdown == nullptr || init() != 0) return false;
  unsigned devices = 0;
  const bool counted = count(&devices) == 0;
  shutdown();
  return counted && devices > 0;
#else
  return false;  // a CPU LibTorch: its workers find no GPU, whatever the machine has
#endif
}

torch::Tensor to_device_from_worker(const torch::Tensor& t, torch::Device device,
                                    torch::ScalarType dtype, bool pin) {
#ifdef USE_C10D_NCCL
  if (device.is_cuda() && t.is_cpu()) {
    const torch::Tensor staged = pin && !t.is_pinned() ? t.pin_memory() : t;
    const auto index = device.has_index() ? device.index() : c10::cuda::current_device();
    auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
    torch::Tensor out;
    {
      c10::cuda::CUDAStreamGuard guard(side);
      out = staged.to(device, dtype, /*non_blocking=*/pin);
    }
    side.synchronize();  // the worker thread waits, not the training loop
    out.record_stream(c10::cuda::getDefaultCUDAStream(index));
    return out;
  }
#endif
  return t.to(device, dtype, /*non_blocking=*/pin && t.is_pinned());
}

bool cuda_initialized() {
  // The driver answers cuDeviceGetCount with CUDA_ERROR_NOT_INITIALIZED until cuInit ran; a
  // driver library nobody loaded was never initialised (a CPU LibTorch never loads it). With no
  // device visible (CUDA_VISIBLE_DEVICES=""), the children will not use CUDA either.
  DriverLibrary driver("libcuda.so.1", /*load=*/false);
  auto count = driver.function<int(int*)>("cuDeviceGetCount");
  int devices = 0;
  return count != nullptr && count(&devices) == 0 /* CUDA_SUCCESS */ && devices > 0;
}

// 2.1 moved the profiler's events from microseconds to nanoseconds (startUs -> startNs).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
int64_t profiler_event_start_us(const torch::autograd::profiler::KinetoEvent& event) {
  return static_cast<int64_t>(event.startNs() / 1000);
}
int64_t profiler_event_duration_us(const torch::autograd::profiler::KinetoEvent& event) {
  return static_cast<int64_t>(event.durationNs() / 1000);
}
#else
int64_t profiler_event_start_us(const torch::autograd::profiler::KinetoEvent& event) {
  return static_cast<int64_t>(event.startUs());
}
int64_t profiler_event_duration_us(const torch::autograd::profiler::KinetoEvent& event) {
  return static_cast<int64_t>(event.durationUs());
}
#endif

}  // namespace accelerant::detail
