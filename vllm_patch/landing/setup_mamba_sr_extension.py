# Lands in setup.py (a source tree's; the reset design), as the last statement of the
# module-level `if _is_cuda():` block (targets/setup_py.py): the extension that the
# CMake target of landing/cmake_mamba_sr_target.cmake defines, for CUDA builds only.

ext_modules.append(CMakeExtension(name="vllm._mamba_sr_C"))
