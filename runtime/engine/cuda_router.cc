#include "runtime/engine/cuda_router.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/router_body.h"
#include "kernels/cuda/cuda_kernels.h"
#include "runtime/engine/cuda_buffers.h"

namespace moed::runtime {

// One layer's router weights on the device.
struct DeviceRouterLayer {
  cuda::DeviceBuffer<float> norm, gate, gate_bias, selection_bias;
  cuda::DeviceMatrix gate_view;  // [experts, hidden], fp32

  DeviceRouterLayer(const LayerWeights& w, int experts, int hidden)
      : norm(floats_on_device(w.norm.data(), w.norm.size())),
        gate(floats_on_device(w.gate.data(), w.gate.size())),
        gate_bias(floats_on_device(w.gate_bias.empty() ? nullptr : w.gate_bias.data(), w.gate_bias.size())),
        selection_bias(
            floats_on_device(w.selection_bias.empty() ? nullptr : w.selection_bias.data(), w.selection_bias.size())) {
    gate_view = {cuda::DeviceDtype::f32, experts, hidden, reinterpret_cast<const unsigned char*>(gate.data()),
                 nullptr};
  }
};

struct CudaRouter::Impl {
  int gpu;
  cuda::Stream stream;
  kernels::RouteRule rule;
  float norm_eps;
  int hidden, experts, width;
  std::vector<DeviceRouterLayer> layers;
  cuda::DeviceBuffer<float> x, xn, logits, weights;
  cuda::DeviceBuffer<int> ids, counts;
  cuda::DeviceBuffer<double> adjust;
  std::vector<float> host_weights;
  std::vector<int> host_ids, host_counts;

  Impl(const Config& config, const ExpertStore& store, int device)
      : gpu((MOED_CUDA_CHECK(cudaSetDevice(device)), device)),
        rule(RouterParams::from(config).rule()),
        norm_eps(float(config.model.norm_eps)),
        hidden(store.shape().hidden),
        experts(store.shape().experts),
        width(kernels::route_width(rule, experts)) {
    layers.reserve(std::size_t(store.shape().layers));
    for (int l = 0; l < store.shape().layers; ++l) layers.emplace_back(store.layer(l), experts, hidden);
  }
  // Frees on the rank's GPU, whichever device the calling thread had current.
  ~Impl() { cudaSetDevice(gpu); }

  // The rows to the device, normalised (into xn) and gated (into logits) on
  // the stream: the device's logits.
  float* norm_and_gate(int layer, const float* host_x, std::size_t count) {
    MOED_CUDA_CHECK(cudaSetDevice(gpu));
    const DeviceRouterLayer& w = layers.at(std::size_t(layer));
    const std::size_t H = std::size_t(hidden), E = std::size_t(experts);
    const int rows = int(count);
    float* dx = device_at_least(x, count * H);
    float* dxn = device_at_least(xn, count * H);
    float* dlogits = device_at_least(logits, count * E);
    MOED_CUDA_CHECK(cudaMemcpyAsync(dx, host_x, count * H * sizeof(float), cudaMemcpyHostToDevice, stream));
    cuda::rms_norm(dx, w.norm.data(), rows, hidden, norm_eps, dxn, stream);
    cuda::gemm_fixed_order(dxn, rows, hidden, w.gate_view, 0, hidden, dlogits, experts, stream);
    if (w.gate_bias.size()) cuda::add_row_bias(dlogits, rows, experts, w.gate_bias.data(), stream);
    return dlogits;
  }
};

CudaRouter::CudaRouter(const Config& config, const ExpertStore& store, int gpu)
    : impl_(std::make_unique<Impl>(config, store, gpu)) {}

CudaRouter::~CudaRouter() = default;

void CudaRouter::route(int layer, const float* x, std::size_t count, float* xn, Routing& routing,
                       const double* adjust) {
  Impl& d = *impl_;
  if (count == 0) return;
  const DeviceRouterLayer& w = d.layers.at(std::size_t(layer));
  const std::size_t H = std::size_t(d.hidden), E = std::size_t(d.experts), W = std::size_t(d.width);
  const int rows = int(count);
  float* dlogits = d.norm_and_gate(layer, x, count);
  float* dxn = d.xn.data();
  float* dweights = device_at_least(d.weights, count * W);
  int* dids = device_at_least(d.ids, count * W);
  int* dcounts = device_at_least(d.counts, count);
  double* dadjust = adjust ? device_at_least(d.adjust, count * E) : nullptr;
  if (adjust)
    MOED_CUDA_CHECK(cudaMemcpyAsync(dadjust, adjust, count * E * sizeof(double), cudaMemcpyHostToDevice, d.stream));
  cuda::route_tokens(dlogits, rows, d.experts, d.rule, w.selection_bias.size() ? w.selection_bias.data() : nullptr,
                     dadjust, dids, dweights, dcounts, d.stream);
  d.host_ids.resize(std::max(d.host_ids.size(), count * W));
  d.host_weights.resize(std::max(d.host_weights.size(), count * W));
  d.host_counts.resize(std::max(d.host_counts.size(), count));
  MOED_CUDA_CHECK(cudaMemcpyAsync(xn, dxn, count * H * sizeof(float), cudaMemcpyDeviceToHost, d.stream));
  MOED_CUDA_CHECK(
      cudaMemcpyAsync(d.host_ids.data(), dids, count * W * sizeof(int), cudaMemcpyDeviceToHost, d.stream));
  MOED_CUDA_CHECK(cudaMemcpyAsync(d.host_weights.data(), dweights, count * W * sizeof(float),
                                  cudaMemcpyDeviceToHost, d.stream));
  MOED_CUDA_CHECK(
      cudaMemcpyAsync(d.host_counts.data(), dcounts, count * sizeof(int), cudaMemcpyDeviceToHost, d.stream));
  d.stream.synchronize();
  for (std::size_t t = 0; t < count; ++t) {
    for (std::size_t i = 0; i < std::size_t(d.host_counts[t]); ++i)
      routing.add(std::uint32_t(d.host_ids[t * W + i]), d.host_weights[t * W + i]);
    routing.end_token();
  }
}

void CudaRouter::norm_and_gate(int layer, const float* x, std::size_t count, float* xn, float* logits) {
  Impl& d = *impl_;
  if (count == 0) return;
  const float* dlogits = d.norm_and_gate(layer, x, count);
  MOED_CUDA_CHECK(cudaMemcpyAsync(xn, d.xn.data(), count * std::size_t(d.hidden) * sizeof(float),
                                  cudaMemcpyDeviceToHost, d.stream));
  MOED_CUDA_CHECK(cudaMemcpyAsync(logits, dlogits, count * std::size_t(d.experts) * sizeof(float),
                                  cudaMemcpyDeviceToHost, d.stream));
  d.stream.synchronize();
}

}  // namespace moed::runtime
