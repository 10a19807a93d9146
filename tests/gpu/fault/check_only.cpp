#include <torch/library.h>
#include <ATen/core/Tensor.h>
void check_only(const at::Tensor& out) {
  TORCH_CHECK(out.dim() == 1, "cpp: out must be 1-D; got ", out.dim(), " dimensions");
}
TORCH_LIBRARY(fault_cpp, m) { m.def("check_only(Tensor(a!) out) -> ()", &check_only); }
