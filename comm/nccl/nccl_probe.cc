#include "comm/nccl/nccl_probe.h"

#include <dlfcn.h>

#include <fmt/format.h>

#include "comm/nccl/nccl_transport.h"

namespace moed::comm {

namespace {

// A library opened for the probe and closed after it.
class Loaded {
 public:
  explicit Loaded(const char* name) : handle_(dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
    if (!handle_) {
      const char* e = dlerror();
      error_ = e ? e : std::string("cannot load ") + name;
    }
  }
  ~Loaded() {
    if (handle_) dlclose(handle_);
  }
  Loaded(const Loaded&) = delete;
  Loaded& operator=(const Loaded&) = delete;

  explicit operator bool() const { return handle_ != nullptr; }
  const std::string& error() const { return error_; }
  // The function `name` as type F, or nullptr.
  template <class F>
  F function(const char* name) const {
    return handle_ ? reinterpret_cast<F>(dlsym(handle_, name)) : nullptr;
  }

 private:
  void* handle_;
  std::string error_;
};

// The driver API's entry points the probe calls (cuda.h's signatures; CUresult 0 is success).
using CuInit = int (*)(unsigned);
using CuDeviceGetCount = int (*)(int*);
using NcclGetVersion = int (*)(int*);

void probe_gpus(NcclFacts& facts) {
  const Loaded driver("libcuda.so.1");
  if (!driver) {
    facts.no_gpu = "no NVIDIA driver (" + driver.error() + ")";
    return;
  }
  const auto init = driver.function<CuInit>("cuInit");
  const auto count = driver.function<CuDeviceGetCount>("cuDeviceGetCount");
  if (!init || !count) {
    facts.no_gpu = "libcuda.so.1 lacks cuInit or cuDeviceGetCount";
  } else if (const int e = init(0); e != 0) {
    facts.no_gpu = fmt::format("cuInit failed (CUresult {})", e);
  } else if (const int c = count(&facts.gpus); c != 0) {
    facts.no_gpu = fmt::format("cuDeviceGetCount failed (CUresult {})", c);
  } else if (facts.gpus == 0) {
    facts.no_gpu = "the driver shows no device";
  }
}

void probe_library(NcclFacts& facts) {
  const Loaded nccl("libnccl.so.2");
  if (!nccl) {
    facts.no_library = nccl.error();
    return;
  }
  const auto version = nccl.function<NcclGetVersion>("ncclGetVersion");
  if (!version || version(&facts.nccl_version) != 0) facts.no_library = "libnccl.so.2 has no working ncclGetVersion";
}

}  // namespace

NcclFacts probe_nccl(const CommConfig& config) {
  NcclFacts facts;
  facts.transport_built = nccl_transport_built();
  facts.experts_on_gpu = config.device >= 0;
  try {
    probe_gpus(facts);
    probe_library(facts);
  } catch (...) {  // only formatting a reason can throw here
    facts.no_gpu = "probe failed";  // short enough not to allocate
  }
  return facts;
}

std::string nccl_version_string(int code) {
  return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
}

std::optional<std::string> nccl_unavailable_with(const NcclFacts& facts) {
  if (!facts.no_gpu.empty()) return "it carries rows in GPU memory, and there is no GPU here: " + facts.no_gpu;
  if (!facts.no_library.empty()) return "NCCL cannot be loaded: " + facts.no_library;
  const std::string here = fmt::format("NCCL {} and {} GPU{} are here", nccl_version_string(facts.nccl_version),
                                       facts.gpus, facts.gpus == 1 ? "" : "s");
  if (facts.nccl_version < kOldestNccl)
    return fmt::format("{}, but the transport needs NCCL {} or later (non-blocking communicators)", here,
                       nccl_version_string(kOldestNccl));
  if (!facts.transport_built)
    return here + ", but this moed was built without nvcc, so without the NCCL transport's CUDA side; use ucx or mpi";
  if (!facts.experts_on_gpu)
    return here + ", but the experts run on the CPU ([experts].device): their rows live in host memory, and NCCL "
                  "would carry every block through the GPU and back; use ucx or mpi";
  return std::nullopt;
}

std::optional<std::string> nccl_unavailable(const CommConfig& config, const Bootstrap&) {
  return nccl_unavailable_with(probe_nccl(config));
}

}  // namespace moed::comm
