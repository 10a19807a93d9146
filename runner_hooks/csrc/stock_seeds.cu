// <namespace>::stock_seeds(Tensor(a!) out): fills `out` with the values that
// len(out) consecutive stock `torch.randint(0, 2**32, (1,), device=out.device)`
// calls would return, with one kernel launch, and advances the device's default
// CUDA generator exactly as those calls would.
//
// Why it is stock-identical (ATen, identical in torch 2.11 and 2.14):
//   torch.randint(0, 2**32, (1,)) runs random_from_to_impl
//   (ATen/native/DistributionTemplates.h) with range = to - from = 2**32 and
//   base = from = 0, then templates::cuda::random_from_to_kernel
//   (ATen/native/cuda/DistributionTemplates.h):
//   - range >= 1 << 28 takes the 64-bit path: dist_func is curand4 folded into
//     ulonglong2{x << 32 | y, z << 32 | w}; the transform of element 0 is
//     transformation::uniform_int_from_to<int64_t>(x << 32 | y, range, base)
//     = int64_t((x << 32 | y) % 2**32 + 0), i.e. the word y.
//   - distribution_nullary_kernel (unroll_factor = 2, numel = 1) gets
//     counter_offset = ((1 - 1) / (256 * grid * 2) + 1) * 4 = 4 from
//     calc_execution_policy and reserves it with gen->philox_cuda_state(4)
//     under gen->mutex_.
//   - distribution_elementwise_grid_stride_kernel writes element 0 from thread
//     idx 0, after curand_init(seed, /*subsequence=*/idx = 0, offset, &state).
// So a stock draw at generator offset o returns that value for curand4 after
// curand_init(seed, 0, o) and moves the offset to o + 4; N draws in a row read
// offsets o, o + 4, ..., o + 4(N - 1) and leave it at o + 4N.  Here the 4N
// offsets are reserved in one philox_cuda_state(4 * N) call and thread k
// computes the value at o + 4k with the same curand calls and transform.
//
// Under CUDA-graph capture philox_cuda_state returns the graph-safe state
// (seed and base offset read on the device, plus this capture's intra-graph
// offset), which unpack() resolves, so every replay draws fresh values, the
// ones stock's captured draws would, and the graph advances the generator by
// the same 4N per replay.

#include <ATen/core/Tensor.h>
#include <ATen/core/TransformationHelper.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/PhiloxUtils.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <curand_kernel.h>
#include <torch/library.h>

#include <cstdint>
#include <mutex>

namespace {

constexpr uint64_t kRange = uint64_t{1} << 32;  // stock's to - from
constexpr int64_t kBase = 0;                    // stock's from
constexpr uint64_t kOffsetsPerDraw = 4;         // counter_offset for numel 1
constexpr int kThreads = 128;

__global__ void stock_seeds_kernel(int64_t* out, int64_t n,
                                   at::PhiloxCudaState philox) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) {
    return;
  }
  const auto [seed, offset] = at::cuda::philox::unpack(philox);
  curandStatePhilox4_32_10_t state;
  curand_init(seed, /*subsequence=*/0, offset + kOffsetsPerDraw * k, &state);
  const uint4 rand_val = curand4(&state);
  const uint64_t rand = (static_cast<uint64_t>(rand_val.x) << 32) | rand_val.y;
  out[k] =
      at::transformation::uniform_int_from_to<int64_t>(rand, kRange, kBase);
}

// Checks that need no device come first, so they can be tested without one.
void stock_seeds(const at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == at::kLong,
              "stock_seeds: out must be int64, the dtype of stock's "
              "torch.randint seeds; got ",
              out.scalar_type());
  TORCH_CHECK(out.dim() == 1,
              "stock_seeds: out must be 1-D, one seed per element; got shape ",
              out.sizes());
  TORCH_CHECK(out.is_contiguous(),
              "stock_seeds: out must be contiguous (seed k is written to "
              "element k of the storage); draw into a contiguous buffer and "
              "copy from it");
  TORCH_CHECK(out.is_cuda(),
              "stock_seeds: out must be a CUDA tensor; its seeds come from its "
              "device's default CUDA generator; got a tensor on ",
              out.device());
  const int64_t n = out.numel();
  if (n == 0) {
    return;  // zero stock draws leave the generator where it is
  }

  // The tensor's device, not the current one: its generator, stream and launch.
  const c10::cuda::CUDAGuard device_guard(out.device());
  auto* gen = at::cuda::detail::getDefaultCUDAGenerator(out.device().index())
                  .get<at::CUDAGeneratorImpl>();
  at::PhiloxCudaState philox;
  {
    // Note [Acquire lock when using random generators]: one locked call makes
    // the 4N offsets one block, so concurrent draws never interleave with it.
    std::lock_guard<std::mutex> lock(gen->mutex_);
    philox = gen->philox_cuda_state(kOffsetsPerDraw * static_cast<uint64_t>(n));
  }
  const auto blocks = static_cast<unsigned int>((n + kThreads - 1) / kThreads);
  // c10::cuda::getCurrentCUDAStream is what at::cuda::getCurrentCUDAStream
  // names, without ATen/cuda/CUDAContext.h's library headers.
  stock_seeds_kernel<<<blocks, kThreads, 0,
                       c10::cuda::getCurrentCUDAStream()>>>(
      out.data_ptr<int64_t>(), n, philox);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

// The namespace comes from the build (seed_kernel.OP_NAMESPACE): runner_hooks
// here, a vLLM-side one in vLLM's copy. One more macro level expands it before
// TORCH_LIBRARY pastes and stringifies it.
#ifndef SR_SEED_OP_NAMESPACE
  #error "build with -DSR_SEED_OP_NAMESPACE=<namespace> (see seed_kernel.py)"
#endif
#define SR_SEED_TORCH_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)

// A catch-all kernel, so a tensor on any device reaches the checks above.
SR_SEED_TORCH_LIBRARY(SR_SEED_OP_NAMESPACE, m) {
  m.def("stock_seeds(Tensor(a!) out) -> ()", &stock_seeds);
}
