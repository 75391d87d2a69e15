"""Launching generated kernels: one small launcher per tuple of argument types, shared by all kernels.

A generated kernel's entry runs the blocks [block_begin, block_end) of a grid. It is compiled without
numba's wrappers (`no_cpython_wrapper`, `no_cfunc_wrapper`: a quarter to a third of a small kernel's numba time)
and called through the address of its machine code, in numba's calling convention:

    launch(pool, entry_address(entry, signature), begin, end, chunks, *arguments)

With one chunk, `launch` calls the entry on the calling thread and an exception the kernel raises
(a debug check's) propagates. With more, it packs the arguments into a block on its stack and hands
the pool's runner (`threads`: the calling thread and helper threads claim the chunks) a function of its
own module that unpacks them and runs one chunk. So `launch`, compiled per tuple of argument types
(~0.15 s, kept in numba's disk cache), has no parallel loop of its own.

Calling through addresses keeps the launcher independent of the kernel. A launcher that named
the entry had to be compiled for each kernel, and numba links the callee's code into the caller
and optimizes it again: about 1 s a kernel (24 of the 44 s of a cold ResNet-50 build).
"""
from __future__ import annotations

import contextlib
import os

from llvmlite import ir as llvm
from numba import njit, typeof, types
from numba.core import cgutils, sigutils
from numba.extending import intrinsic

from . import threads

try:
    import fcntl
except ImportError:     # not on Windows: numba's caches are then not locked
    fcntl = None

PARALLEL_FAILURE = ("a cpu kernel raised in a parallel launch, whose chunks drop the exception: its scratch "
                    "allocation failed (out of memory?). td.debug(True) runs its blocks one by one, with checks")


def _call(context, builder, address, arg_types: tuple, values: list, restype=types.none):
    """Emit a call of the numba function at `address` (an integer value) on `values` of `arg_types`: (its status,
    its `restype` value) (numba's calling convention: a status code, a slot for the return value and one for an
    exception)."""
    fn_type = context.call_conv.get_function_type(restype, arg_types)
    return context.call_conv.call_function(builder, builder.inttoptr(address, fn_type.as_pointer()), restype,
                                           arg_types, values)


def _unpacked(builder, args, arg_tuple) -> list:
    return [builder.extract_value(arg_tuple, i) for i in range(len(args))]


@intrinsic
def call_entry(typingctx, address, args, begin, end):
    """Call the kernel entry at `address` on the tuple `args` and the block range [begin, end); an exception
    the kernel raises propagates to the caller."""

    def codegen(context, builder, signature, values):
        address_value, arg_tuple, begin_value, end_value = values
        status, _ = _call(context, builder, address_value, (*args, begin, end),
                          _unpacked(builder, args, arg_tuple) + [begin_value, end_value])
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return context.get_dummy_value()

    return types.none(address, args, begin, end), codegen


def _define_share(context, module, args) -> llvm.Function:
    """The share function of a launcher's module: it unpacks {entry address, args} and calls the entry on a
    block range."""
    share = llvm.Function(module, threads.SHARE_TYPE, module.get_unique_name("taskdsl_share"))
    share.linkage = "internal"
    builder = llvm.IRBuilder(share.append_basic_block())
    packed, begin, end = share.args
    pack_type = llvm.LiteralStructType([llvm.IntType(64), context.get_value_type(args)])
    pack = builder.load(builder.bitcast(packed, pack_type.as_pointer()))
    status, _ = _call(context, builder, builder.extract_value(pack, 0), (*args, types.int64, types.int64),
                      _unpacked(builder, args, builder.extract_value(pack, 1)) + [begin, end])
    builder.ret(builder.zext(status.is_error, llvm.IntType(32)))
    return share


@intrinsic
def _run_chunks(typingctx, pool, address, args, begin, end, chunks):
    """Run the kernel entry at `address` on `args` over blocks [begin, end) in `chunks` chunks on this thread and
    the helper threads of the pool whose state is at `pool` (`threads`): whether every chunk returned without
    raising."""

    def codegen(context, builder, signature, values):
        pool_value, address_value, arg_tuple, begin_value, end_value, chunks_value = values
        pack = cgutils.alloca_once_value(builder, cgutils.make_anonymous_struct(builder, [address_value, arg_tuple]))
        share = _define_share(context, builder.module, args)
        i64 = llvm.IntType(64)
        runner = builder.load(builder.gep(builder.inttoptr(pool_value, i64.as_pointer()), [i64(threads.RUNNER)]))
        runner_args = [pool_value, builder.ptrtoint(share, i64), builder.ptrtoint(pack, i64), begin_value, end_value,
                       chunks_value]
        status, succeeded = _call(context, builder, runner, (types.int64,) * 6, runner_args, types.boolean)
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return succeeded

    return types.boolean(pool, address, args, begin, end, chunks), codegen


@intrinsic
def _pack(typingctx, destination, room, address, args):
    """Write {address, args} as a share function unpacks them at `destination` (`room` bytes there): the share
    function's address, or 0 where they need more room. The arrays go without their meminfos, which the call's
    unboxing made and its return frees (numba's reference counts skip a null one): their memory must outlive the
    pack's uses."""

    def codegen(context, builder, signature, values):
        destination_value, room_value, address_value, arg_tuple = values
        for k, arg_type in enumerate(args):
            if isinstance(arg_type, types.Array):
                array = context.make_array(arg_type)(context, builder, value=builder.extract_value(arg_tuple, k))
                array.meminfo = cgutils.get_null_value(array.meminfo.type)
                array.parent = cgutils.get_null_value(array.parent.type)
                arg_tuple = builder.insert_value(arg_tuple, array._getvalue(), k)
        pack = cgutils.make_anonymous_struct(builder, [address_value, arg_tuple])
        i64 = llvm.IntType(64)
        fits = builder.icmp_signed("<=", i64(context.get_abi_sizeof(pack.type)), room_value)
        result = cgutils.alloca_once_value(builder, i64(0))
        with builder.if_then(fits):
            builder.store(pack, builder.inttoptr(destination_value, pack.type.as_pointer()))
            builder.store(builder.ptrtoint(_define_share(context, builder.module, args), i64), result)
        return builder.load(result)

    return types.int64(destination, room, address, args), codegen


PACK = -1       # `launch`'s chunks that ask for its arguments packed, not run


@njit(nogil=True, cache=True)
def launch(pool, address, begin, end, chunks, *args):
    """Blocks [begin, end) of the kernel entry at `address` on `args`: on this thread (one chunk), else in `chunks`
    chunks on this thread and the helper threads of the pool whose state is at `pool` (`threads.Pool`); 0.
    With chunks PACK, run nothing: pack {address, args} at address `begin`, `end` bytes there, and return the
    share function's address that runs blocks of them (`threads.replay`; 0: more room needed)."""
    if chunks == PACK:
        return _pack(begin, end, address, args)
    if chunks <= 1:
        call_entry(address, args, begin, end)
    elif not _run_chunks(pool, address, args, begin, end, chunks):
        raise RuntimeError(PARALLEL_FAILURE)
    return 0


def compiled(dispatcher, signature: tuple):
    """`dispatcher`'s compile result for `signature` (numba types), compiled or loaded from numba's disk cache now
    if need be, with that cache locked against other processes.

    Numba names a new entry's data file after the cache index as it read it: two processes sharing the cache
    (pytest's workers, two notebooks) that compile at once could each write the same file, and the index then
    sends one signature to another's code, which a call runs on arguments it was not compiled for. Under the
    lock a process reads and writes the index alone; an entry already damaged that way (its code is for another
    signature) is dropped from the index and compiled again."""
    return _compiled(dispatcher, dispatcher.compile, tuple(signature))


def lock_compiles(dispatcher) -> None:
    """Make numba's own compiles of `dispatcher` (a helper it compiles when it types a caller) take the lock and
    the repair of `compiled`."""
    unlocked = dispatcher.compile

    def compile(signature):
        args, _ = sigutils.normalize_signature(signature)
        return _compiled(dispatcher, unlocked, tuple(args)).entry_point
    dispatcher.compile = compile


def _compiled(dispatcher, compile, signature: tuple):
    if signature in dispatcher.overloads:
        return dispatcher.overloads[signature]
    damage_tolerant(dispatcher)
    with _cache_lock(dispatcher):
        compile(signature)
        if signature not in dispatcher.overloads:
            dispatcher._cache.flush()
            compile(signature)
    return dispatcher.overloads[signature]


def damage_tolerant(dispatcher) -> None:
    """Make `dispatcher`'s numba disk cache best effort. A damaged file is a miss: numba unpickles its index and
    data files itself, and a truncated or garbled one raised at every call, forever (now the index is dropped and
    the function compiled and cached again). A file it cannot write (a full disk) is not written: the compiled code
    is used all the same."""
    cache = getattr(dispatcher, "_cache", None)
    load, save = getattr(cache, "load_overload", None), getattr(cache, "save_overload", None)
    if load is None or getattr(load, "tolerant", False):
        return

    def load_overload(sig, target_context):
        try:
            return load(sig, target_context)
        except Exception:  # noqa: BLE001 - whatever a damaged file raises (EOFError, UnpicklingError, LLVM's ...)
            with contextlib.suppress(OSError):
                cache.flush()
            return None

    def save_overload(sig, data):
        with contextlib.suppress(OSError):      # ENOSPC, a folder gone read-only
            save(sig, data)

    load_overload.tolerant = True
    cache.load_overload, cache.save_overload = load_overload, save_overload


@contextlib.contextmanager
def _cache_lock(dispatcher):
    """An exclusive lock on `dispatcher`'s numba cache (a file beside its index); none where it cannot be made."""
    cache = getattr(dispatcher, "_cache", None)
    path = getattr(cache, "_cache_path", None)
    try:
        handle = open(os.path.join(path, cache._impl.filename_base + ".lock"), "a") if path else None
    except OSError:
        handle = None
    if handle is None or fcntl is None:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def entry_address(dispatcher, signature: tuple) -> int:
    """The address of `dispatcher`'s machine code for `signature` (numba types, the block range's included),
    compiled or loaded from numba's cache now if need be: its function in numba's calling convention."""
    result = compiled(dispatcher, signature)
    return result.library.get_pointer_to_function(result.fndesc.llvm_func_name)


def launcher_signature(args: tuple) -> tuple:
    """The numba signature `launch` is compiled for to take `args` (after the five block-range ints): numba folds
    its star arguments into one tuple."""
    return (types.int64,) * 5 + (typeof(tuple(args)),)
