#include "launch/rank_gpu.h"

#include <algorithm>
#include <string_view>
#include <vector>

namespace moed::launch {

namespace {

std::vector<std::string> entries(std::string_view cuda_visible_devices) {
  std::vector<std::string> parts;
  for (std::size_t start = 0;;) {
    const std::size_t end = cuda_visible_devices.find(',', start);
    parts.emplace_back(cuda_visible_devices.substr(start, end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

}  // namespace

RankGpu gpu_of_rank(int local_rank, int visible_gpus,
                    const std::optional<std::string>& cuda_visible_devices) {
  if (visible_gpus <= 0) return {};
  RankGpu gpu;
  gpu.device = std::max(0, local_rank) % visible_gpus;
  if (!cuda_visible_devices) {
    gpu.physical = std::to_string(gpu.device);
  } else {
    const std::vector<std::string> listed = entries(*cuda_visible_devices);
    if (std::size_t(gpu.device) < listed.size()) gpu.physical = listed[std::size_t(gpu.device)];
  }
  return gpu;
}

int visible_gpu_count(int host_gpus, const std::optional<std::string>& cuda_visible_devices) {
  if (!cuda_visible_devices) return std::max(0, host_gpus);
  if (cuda_visible_devices->empty()) return 0;
  return int(std::count(cuda_visible_devices->begin(), cuda_visible_devices->end(), ',')) + 1;
}

}  // namespace moed::launch
