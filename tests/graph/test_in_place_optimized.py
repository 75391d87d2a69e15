"""Residual sums in place on the templates' optimized kernels (unrolled register tiles, the depthwise kernel's
unrolled window), which the models run; `test_in_place.py` runs the fast-compile kernels over many shapes."""
import pytest

from .test_in_place import check_residual_convs, residual_convs

OPTIMIZED = True


@pytest.mark.parametrize("c, hw, kernel, stride, groups", [
    (8, (5, 13), 3, 1, 8),        # depthwise: inner pixels, borders, a last group of pixels past the row
    (40, (6, 6), 1, 1, 1),        # a 1x1 convolution: the template's product and its store (the indirect GEMM's
                                  # and the residual products' too; test_in_place.py runs them over many shapes)
])
def test_optimized_residual_convolutions_sum_in_place(c, hw, kernel, stride, groups):
    check_residual_convs(residual_convs(2, c, hw, kernel, stride, 1, groups, True, False), channels_last=True)

