"""A failed check of the seed op in a fresh process: `python call_op.py cu|cpp DEVICES`.

cu builds runner_hooks/core/csrc/stock_seeds.cu as seed_kernel does, under the
namespace fault_cu; cpp builds check_only.cpp (the same kind of failed TORCH_CHECK,
no nvcc). Each device of DEVICES (cpu,cuda) gets a 2-D int64 buffer, which the
check rejects."""

import sys
from pathlib import Path

import torch
from torch.utils import cpp_extension

HERE = Path(__file__).resolve().parent
if sys.argv[1] == "cu":
    from runner_hooks.core import seed_kernel

    seed_kernel.OP_NAMESPACE = "fault_cu"  # a build apart, with seed_kernel's own flags
    seed_kernel.build_library([(9, 0)])
    op = torch.ops.fault_cu.stock_seeds.default
else:
    cpp_extension.load(
        name="fault_cpp", sources=[str(HERE / "check_only.cpp")], is_python_module=False
    )
    op = torch.ops.fault_cpp.check_only.default
for device in sys.argv[2].split(","):
    try:
        op(torch.empty(2, 2, dtype=torch.int64, device=device))
    except RuntimeError as error:
        print(device, "raised:", str(error).splitlines()[0][:100], flush=True)
print("no crash", flush=True)
