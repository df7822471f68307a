#include "runtime/engine/cuda_expert_executor.h"

#include <cstring>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/bf16_dot_gemm.h"
#include "kernels/cpu/encoded_matrix.h"
#include "kernels/cuda/cuda_kernels.h"
#include "runtime/engine/cuda_buffers.h"

namespace moed::runtime {

namespace {

// An expert's matrix as encoded_matrix.h lays it out, whichever form the store holds.
kernels::EncodedMatrix encoded(const kernels::QuantWeights* quant, const kernels::PackedWeights* packed,
                               const float* row_major, std::size_t n, std::size_t k) {
  if (quant) return quant->encoded();
  kernels::EncodedMatrix m;
  m.dtype = kernels::WeightDtype::f32;
  m.n = n;
  m.k = k;
  m.codes.resize(n * k * sizeof(float));
  if (packed) {
    std::vector<float> values(n * k);
    packed->unpack(values.data());
    std::memcpy(m.codes.data(), values.data(), m.codes.size());
  } else {
    MOED_CHECK(row_major, "an expert view with no weights");
    std::memcpy(m.codes.data(), row_major, m.codes.size());
  }
  return m;
}

// One matrix on the device, and the view the kernels read it through.
struct DeviceCopy {
  cuda::DeviceBuffer<unsigned char> codes, scales;
  cuda::DeviceMatrix view;

  explicit DeviceCopy(const kernels::EncodedMatrix& m) : codes(m.codes.size()), scales(m.scales.size()) {
    codes.upload(m.codes);
    if (!m.scales.empty()) scales.upload(m.scales);
    view = {cuda::DeviceDtype(int(m.dtype)), static_cast<long long>(m.n), static_cast<long long>(m.k), codes.data(),
            m.scales.empty() ? nullptr : scales.data()};
  }
};

}  // namespace

// An expert's weights on the device, and the step that last used them.
struct DeviceExpertWeights {
  DeviceCopy w13, w2;
  cuda::DeviceBuffer<float> b13, b2;
  cuda::DeviceExpert view;
  std::uint64_t last_step = 0;

  explicit DeviceExpertWeights(const kernels::ExpertView& e)
      : w13(encoded(e.w13_quant, e.w13_packed, e.w13, 2 * e.ffn, e.hidden)),
        w2(encoded(e.w2_quant, e.w2_packed, e.w2, e.hidden, e.ffn)),
        b13(floats_on_device(e.b13, 2 * e.ffn)),
        b2(floats_on_device(e.b2, e.hidden)) {
    view.w13 = w13.view;
    view.w2 = w2.view;
    view.b13 = e.b13 ? b13.data() : nullptr;
    view.b2 = e.b2 ? b2.data() : nullptr;
    view.hidden = int(e.hidden);
    view.ffn = int(e.ffn);
    view.chunks = int(e.chunks);
    view.activation = {e.activation.clamped, e.activation.alpha, e.activation.limit};
  }
};

struct CudaExpertExecutor::Impl {
  int gpu;
  cuda::Stream stream;
  std::unordered_map<std::uint64_t, DeviceExpertWeights> experts;  // by ExpertView::serial
  std::uint64_t step = 0;
  const DeviceExpertWeights* current = nullptr;  // the expert of the block in flight
  cuda::DeviceExpert view;                       // its view, with the job's products
  cuda::DeviceBuffer<float> x, h13, y;           // one block's rows, up-projection and chunk output
  std::vector<float> y_host;

  explicit Impl(int device) : gpu((MOED_CUDA_CHECK(cudaSetDevice(device)), device)) {}
  // Frees on the rank's GPU, whichever device the calling thread had current.
  ~Impl() { cudaSetDevice(gpu); }

  const DeviceExpertWeights& weights_of(const kernels::ExpertView& e) {
    MOED_CHECK(e.serial != 0, "an expert view without a slot number cannot be held on the GPU");
    auto it = experts.find(e.serial);
    if (it == experts.end()) it = experts.try_emplace(e.serial, e).first;
    it->second.last_step = step;
    return it->second;
  }
};

CudaExpertExecutor::CudaExpertExecutor(int gpu, std::size_t block_rows)
    : RowBlockExecutor(block_rows), impl_(std::make_unique<Impl>(gpu)) {}

CudaExpertExecutor::~CudaExpertExecutor() = default;

void CudaExpertExecutor::begin_step() {
  MOED_CUDA_CHECK(cudaSetDevice(impl_->gpu));
  ++impl_->step;
  std::erase_if(impl_->experts, [&](const auto& entry) { return impl_->step - entry.second.last_step > kIdleSteps; });
}

std::size_t CudaExpertExecutor::experts_on_device() const { return impl_->experts.size(); }

void CudaExpertExecutor::up(const kernels::ExpertView& expert, const float* x, std::size_t m) {
  Impl& d = *impl_;
  MOED_CUDA_CHECK(cudaSetDevice(d.gpu));
  d.current = &d.weights_of(expert);
  const std::size_t H = expert.hidden, F = expert.ffn;
  float* dx = device_at_least(d.x, m * H);
  MOED_CUDA_CHECK(cudaMemcpyAsync(dx, x, m * H * sizeof(float), cudaMemcpyHostToDevice, d.stream));
  d.view = d.current->view;
  d.view.products = kernels::compact_products() == kernels::CompactProducts::bf16 ? cuda::DeviceProducts::bf16
                                                                                  : cuda::DeviceProducts::f32;
  cuda::expert_ffn_up_fixed(d.view, dx, int(m), device_at_least(d.h13, m * 2 * F), d.stream);
}

const float* CudaExpertExecutor::down_chunk(const kernels::ExpertView& expert, std::size_t m, std::size_t chunk) {
  Impl& d = *impl_;
  const std::size_t H = expert.hidden;
  float* dy = device_at_least(d.y, m * H);
  cuda::expert_ffn_down_chunk_fixed(d.view, d.h13.data(), int(m), int(chunk), dy, d.stream);
  float* y = at_least(d.y_host, m * H);
  MOED_CUDA_CHECK(cudaMemcpyAsync(y, dy, m * H * sizeof(float), cudaMemcpyDeviceToHost, d.stream));
  d.stream.synchronize();
  return y;
}

}  // namespace moed::runtime
