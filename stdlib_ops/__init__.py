"""The operator library, written in the taskdsl kernel language."""
from .design_matmul import matmul_kernel
from .gemm import batch_matmul, linear, matmul
from .conv import conv2d
from .elementwise import *  # noqa: F401,F403 - add, sub, mul, div, pow, maximum, minimum, relu, gelu, ...
from .reduce import *  # noqa: F401,F403 - sum, mean, max, min, argmax, argmin
from .norm import *  # noqa: F401,F403 - softmax, log_softmax, layer_norm, rms_norm, batch_norm
from .transform import *  # noqa: F401,F403 - transpose, permute, reshape, slice, concat, pad, gather, expand
from .pool import *  # noqa: F401,F403 - max_pool2d, avg_pool2d, global_avg_pool2d
