"""A kernel's source is parsed once per code object: template factories make many kernels of one def."""
import numpy as np

import taskdsl as td
from taskdsl.frontend.source import parse_function

from .program_files import load_program

FACTORY = '''
import taskdsl as td
from taskdsl import f32, threadIdx


@td.func
def shifted(v: f32) -> f32:
    return v + {shift}


def make(scale):
    @td.kernel(grid=1, block=4)
    def scaled(X: f32[4], Y: f32[4]):
        Y[threadIdx.x] = shifted(X[threadIdx.x]) * scale

    return scaled
'''


def test_kernels_of_one_def_share_its_parse_and_a_new_definition_is_parsed_again():
    td.set_target("cpu")
    x = np.arange(4, dtype=np.float32)
    first = load_program(FACTORY.format(shift=1), "factory")
    double, triple = first.make(2.0), first.make(3.0)
    assert parse_function(double.fn) is parse_function(triple.fn)
    for kernel, scale in ((double, 2), (triple, 3)):       # each kernel keeps its own closure value
        y = np.zeros(4, np.float32)
        kernel(x, y)
        np.testing.assert_array_equal(y, (x + 1) * scale)
    second = load_program(FACTORY.format(shift=10), "factory")     # the def again, with other text
    again = second.make(2.0)
    assert parse_function(again.fn) is not parse_function(double.fn)
    y = np.zeros(4, np.float32)
    again(x, y)
    np.testing.assert_array_equal(y, (x + 10) * 2)
