"""The window attributes of convolutions and pools (strides, pads, dilations, auto_pad), shared by their
converters."""
from __future__ import annotations

from .errors import OnnxImportError
from .node import Node

WINDOW_ATTRS = ("auto_pad", "dilations", "kernel_shape", "pads", "strides")


def window(node: Node, x, kernel: tuple) -> tuple:
    """(strides, pads (begin..., end...), dilations) of a conv / pool node, auto_pad resolved."""
    rank = len(kernel)
    strides = tuple(node.attr("strides", [1] * rank))
    dilations = tuple(node.attr("dilations", [1] * rank))
    auto_pad = node.attr("auto_pad", "NOTSET")
    if len(strides) != rank or len(dilations) != rank:
        raise node.error(f"strides {strides} and dilations {dilations} need {rank} values", OnnxImportError)
    if auto_pad != "NOTSET" and any(node.attr("pads", [])):    # the spec allows one of them, onnxruntime refuses both
        raise node.error(f"pads {tuple(node.attr('pads'))} and auto_pad={auto_pad!r} are both given; the operator "
                         "takes one of them", OnnxImportError)
    if auto_pad == "NOTSET":
        pads = tuple(node.attr("pads", [0] * 2 * rank))
    elif auto_pad == "VALID":
        pads = (0,) * 2 * rank
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for n, k, s, d in zip(x.shape[2:], kernel, strides, dilations):
            total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
            small = total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else total - small)
            end.append(total - small if auto_pad == "SAME_UPPER" else small)
        pads = tuple(begin + end)
    else:
        raise node.error(f"auto_pad={auto_pad!r} is not supported (NOTSET, VALID, SAME_UPPER, SAME_LOWER)")
    if len(pads) != 2 * rank:
        raise node.error(f"pads {pads} need {2 * rank} values (begin..., end...)", OnnxImportError)
    return strides, pads, dilations
