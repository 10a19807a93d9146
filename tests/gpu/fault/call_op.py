"""A failed check of the seed op in a fresh process: `python call_op.py cu|cpp DEVICES`.

cu builds runner_hooks/core/csrc/stock_seeds.cu apart (namespace fault_cu); cpp builds
check_only.cpp (the same kind of failed TORCH_CHECK, no nvcc). Each device of DEVICES
(cpu,cuda) gets a 2-D int64 buffer, which the check rejects."""

import sys
from pathlib import Path

import torch
from torch.utils import cpp_extension

HERE = Path(__file__).resolve().parent
if sys.argv[1] == "cu":
    cpp_extension.load(
        name="fault_cu",
        sources=[str(HERE.parents[2] / "runner_hooks/core/csrc/stock_seeds.cu")],
        is_python_module=False,
        extra_cuda_cflags=[
            "-O3",
            "-DSR_SEED_OP_NAMESPACE=fault_cu",
            "-gencode=arch=compute_90,code=sm_90",
        ],
    )
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
