"""The operator library, written in the taskdsl kernel language."""
from .simt_matmul import matmul, matmul_kernel
