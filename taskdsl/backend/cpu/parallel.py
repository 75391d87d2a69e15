"""Block-parallel launches on numba's threads: one launcher per argument types, shared by all kernels.

A generated kernel's entry runs the blocks [block_begin, block_end) of a grid. `run_parallel` splits
the blocks into `chunks` equal shares and runs them in a `prange` loop (numba's OpenMP-style
fork-join, ~2 us a launch), calling the entry through the C address of its machine code:

    run_parallel(entry_address(entry, signature), chunks, blocks, *arguments)

Calling through the address keeps the launcher independent of the kernel. A launcher that named
the entry had to be compiled for each kernel, and numba links the callee's code into the caller
and optimizes it again: about 1 s a kernel (24 of the 44 s of a cold ResNet-50 build). This one
compiles once per tuple of argument types (~0.2 s) and stays in numba's disk cache.
"""
from __future__ import annotations

from llvmlite import ir as llvm
from numba import njit, prange, types
from numba.extending import intrinsic


@intrinsic
def _call_entry(typingctx, address, args, begin, end):
    """Call the machine code at `address` on the tuple `args` and the block range [begin, end)."""
    arg_types = (*args, begin, end)

    def codegen(context, builder, signature, values):
        address_value, arg_tuple, begin_value, end_value = values
        call_values = [builder.extract_value(arg_tuple, i) for i in range(len(args))] + [begin_value, end_value]
        # numba's C wrapper of a compiled function: its arguments by value, in numba's data layout
        fn_type = llvm.FunctionType(context.get_value_type(types.none),
                                    [context.get_value_type(t) for t in arg_types])
        builder.call(builder.inttoptr(address_value, fn_type.as_pointer()), call_values)
        return context.get_dummy_value()

    return types.none(address, args, begin, end), codegen


@njit(parallel=True, nogil=True, cache=True)
def run_parallel(address, chunks, blocks, *args):
    """Blocks [0, blocks) of the entry at `address` on `args`, in `chunks` equal shares on numba's threads."""
    for chunk in prange(chunks):
        _call_entry(address, args, blocks * chunk // chunks, blocks * (chunk + 1) // chunks)


def entry_address(dispatcher, signature: tuple) -> int:
    """The C address of `dispatcher`'s machine code for `signature` (numba types, the block range's
    included), compiled or loaded from numba's cache now if need be."""
    dispatcher.compile(signature)
    result = dispatcher.overloads[signature]
    return result.library.get_pointer_to_function(result.fndesc.llvm_cfunc_wrapper_name)
