// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: Copyright contributors to the vLLM project
//
// stock_seeds(out): the values of len(out) consecutive stock
// torch.randint(0, 2**32, (1,)) calls from one launch, advancing the device's
// default CUDA generator as they would. A stock draw (random_from_to_kernel,
// range 2**32, numel 1) reserves 4 Philox offsets with philox_cuda_state(4);
// thread 0 runs curand_init(seed, 0, o) and curand4, and uniform_int_from_to
// keeps the low 32 bits of x << 32 | y. So N draws read offsets o, o + 4, ...,
// o + 4(N - 1): here the 4N offsets are reserved at once and thread k computes
// the draw at o + 4k. Under graph capture, philox_cuda_state gives the
// graph-safe state, so each replay draws fresh values, as stock's do.
//
// A non-stable op (vLLM's _mamba_sr_C extension): it reads the default CUDA
// generator's Philox state, which torch's stable ABI offers from torch 2.16
// (torch::stable::Generator::philox_state(increment) and
// get_default_generator(device), torch/csrc/stable/generator_inl.h, under
// TORCH_VERSION_2_16_0). With them the op moves into _C_stable_libtorch
// (csrc/libtorch_stable/, STABLE_TORCH_LIBRARY): only the host function's
// generator lines and the registration below change.

#include "core/registration.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/TransformationHelper.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/PhiloxUtils.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <curand_kernel.h>
#include <torch/all.h>
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

void stock_seeds(const at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == at::kLong,
              "stock_seeds: out must be int64, as stock's seeds; got ",
              out.scalar_type());
  TORCH_CHECK(out.dim() == 1, "stock_seeds: out must be 1-D, one seed each; ",
              "got shape ", out.sizes());
  TORCH_CHECK(out.is_contiguous(), "stock_seeds: out must be contiguous");
  TORCH_CHECK(out.is_cuda(), "stock_seeds: out must be a CUDA tensor; ",
              "got a tensor on ", out.device());
  const int64_t n = out.numel();
  if (n == 0) {
    return;  // zero stock draws leave the generator where it is
  }

  const c10::cuda::CUDAGuard device_guard(out.device());
  auto* gen = at::cuda::detail::getDefaultCUDAGenerator(out.device().index())
                  .get<at::CUDAGeneratorImpl>();
  at::PhiloxCudaState philox;
  {
    // Note [Acquire lock when using random generators]
    std::lock_guard<std::mutex> lock(gen->mutex_);
    philox = gen->philox_cuda_state(kOffsetsPerDraw * static_cast<uint64_t>(n));
  }
  const auto blocks = static_cast<unsigned int>((n + kThreads - 1) / kThreads);
  stock_seeds_kernel<<<blocks, kThreads, 0,
                       c10::cuda::getCurrentCUDAStream()>>>(
      out.data_ptr<int64_t>(), n, philox);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, m) {
  m.def("stock_seeds(Tensor! out) -> ()");
  m.impl("stock_seeds", torch::kCUDA, &stock_seeds);
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
