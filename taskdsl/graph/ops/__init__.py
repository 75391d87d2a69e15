"""The graph op set: functions on symbolic Tensors that add Operators to the traced graph.

    from taskdsl.graph import ops
    y = ops.relu(ops.conv2d(x, w, b, padding=1))

Every op is an Operator defined by compute definitions (its numpy reference and its kernels).
"""
from .elementwise import (FUNCTIONS, Elementwise, FusedElementwise, add, cast, clip, div, elementwise, equal, erf,
                          exp, gelu, greater, less, log, maximum, minimum, mul, neg, pow, relu, rsqrt, sigmoid, silu, sqrt,
                          sub, tanh, where)
from .linalg import (Conv, IntegerConv, IntegerMatMul, MatMul, conv, conv2d, integer_conv, integer_matmul, linear,
                     matmul)
from .norm import (LRN, BatchNorm, LayerNorm, Softmax, batch_norm, instance_norm, layer_norm, log_softmax, lrn,
                   rms_norm, softmax)
from .pool import Pool, avg_pool2d, max_pool2d, max_pool_with_indices, pool
from .sample import GridSample, grid_sample
from .reduce import ArgReduce, Reduce, argmax, argmin, global_avg_pool, global_max_pool, max, mean, min, prod, sum
from .scatter import ScatterElements, ScatterND, TensorScatter, scatter_elements, scatter_nd, tensor_scatter
from .sort import TopK, topk
from .transform import (Concat, Cumulative, Expand, Gather, GatherElements, Pad, Resample, Reshape, Slice, Transpose,
                        concat, cumprod, cumsum, expand, flatten, gather, gather_elements, pad, resample, reshape,
                        slice, split, squeeze, transpose, unsqueeze)

__all__ = [
    # elementwise
    "FUNCTIONS", "Elementwise", "FusedElementwise", "elementwise", "add", "sub", "mul", "div", "pow", "maximum",
    "minimum", "equal", "less", "greater", "neg", "relu", "gelu", "silu", "sigmoid", "tanh", "erf", "exp", "log",
    "sqrt", "rsqrt", "where", "cast", "clip",
    # anchors (and the 8-bit integer product and convolution, which run on their own)
    "MatMul", "IntegerMatMul", "Conv", "IntegerConv", "matmul", "integer_matmul", "linear", "conv", "integer_conv",
    "conv2d",
    # normalization
    "Softmax", "LayerNorm", "BatchNorm", "LRN", "softmax", "log_softmax", "layer_norm", "instance_norm", "rms_norm",
    "batch_norm", "lrn",
    # pooling and reductions
    "Pool", "pool", "max_pool2d", "max_pool_with_indices", "avg_pool2d", "Reduce", "sum", "mean", "max", "min", "prod",
    "global_avg_pool", "global_max_pool", "ArgReduce", "argmax", "argmin", "TopK", "topk",
    # data movement
    "Reshape", "Transpose", "Concat", "Slice", "Gather", "Expand", "Pad", "reshape", "flatten", "squeeze", "unsqueeze",
    "transpose", "concat", "split", "slice", "gather", "expand", "pad", "GatherElements", "Cumulative", "Resample",
    "gather_elements", "cumsum", "cumprod", "resample", "ScatterElements", "ScatterND", "scatter_elements",
    "scatter_nd", "TensorScatter", "tensor_scatter",
    # sampling at computed positions
    "GridSample", "grid_sample",
]
