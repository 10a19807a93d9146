# Lands in CMakeLists.txt (a source tree's; the reset design), before the block that
# includes the first external project (targets/cmake_lists.py): after every extension
# target of vLLM's own, where the CUDA architectures and flags are set, and before
# vllm_flash_attn.cmake overrides CMake functions; a blank line after it.

#
# _mamba_sr_C extension: the Mamba stochastic-rounding seed op. Not in
# _C_stable_libtorch: it reads torch's CUDA generator (Philox state), which
# the stable ABI exposes only from torch 2.16.
#
if(VLLM_GPU_LANG STREQUAL "CUDA")
  set(VLLM_MAMBA_SR_EXT_SRC
    "csrc/mamba/stock_seeds.cu")

  set_gencode_flags_for_srcs(
    SRCS "${VLLM_MAMBA_SR_EXT_SRC}"
    CUDA_ARCHS "${CUDA_ARCHS}")

  message(STATUS "Enabling mamba_sr extension.")
  define_extension_target(
    _mamba_sr_C
    DESTINATION vllm
    LANGUAGE ${VLLM_GPU_LANG}
    SOURCES ${VLLM_MAMBA_SR_EXT_SRC}
    COMPILE_FLAGS ${VLLM_GPU_FLAGS}
    ARCHITECTURES ${VLLM_GPU_ARCHES}
    USE_SABI 3
    WITH_SOABI)
endif()
