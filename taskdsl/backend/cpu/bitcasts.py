"""Bit casts between float32 and integers for the numba helpers (`support`, `trig`): LLVM bitcasts, free."""
from __future__ import annotations

from llvmlite import ir as llvm_ir
from numba import types
from numba.extending import intrinsic


def low_bits(builder, value, width: int, wanted: int):
    """The low `wanted` bits of an integer value `width` bits wide (zero-extended when narrower)."""
    if width == wanted:
        return value
    return (builder.trunc if width > wanted else builder.zext)(value, llvm_ir.IntType(wanted))


@intrinsic
def f32_from_bits(typingctx, bits):
    """The f32 whose bit pattern is the low 32 bits of the integer `bits` (a bitcast)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(low_bits(builder, args[0], bits.bitwidth, 32), llvm_ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def bits_of_f32(typingctx, x):
    """The bit pattern of the f32 x, as a uint32 (a bitcast)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_ir.IntType(32))

    return types.uint32(x), codegen
