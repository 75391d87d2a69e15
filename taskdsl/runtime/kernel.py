"""Kernel objects: argument binding, per-specialization compilation, launch."""
from __future__ import annotations

import functools
import inspect
import math
import struct
from dataclasses import dataclass, field

import numpy as np

from .. import ir
from ..backend.cpu import precompile
from ..backend.cuda.launch import check_host_arrays_apart, check_launch_dims
from ..ir import types as T
from ..errors import DSLError
from ..frontend.autoreload import follow_autoreload
from .arrays import conversion, host_view
from .config import cp_async_early_enabled, debug_enabled, fast_compile_enabled, full_tracebacks_enabled, get_target
from .device_array import DeviceArray
from .sharing import share_with_earlier


@dataclass
class Binding:
    """One call's arguments matched to the kernel's parameters."""

    values: list        # arrays and scalars, in parameter order
    sizes: dict         # size-symbol name -> int
    grid: tuple
    block: tuple


@dataclass(frozen=True)
class CompiledKernel:
    """A compiled specialization: the generated source and, for cuda, the cubin."""

    target: str
    source: str = field(repr=False)
    binary: bytes | None = field(default=None, repr=False)
    arch: str | None = None
    dynamic_shared_bytes: int = 0   # cuda: shared memory to request at launch (buffers past 48 KiB)
    unused_params: frozenset = frozenset()   # cuda: indices of array parameters the code never names
    symbol: str = ""                # cuda: the C name of the `__global__` function


BINDINGS_PER_KERNEL = 64      # remembered argument signatures per kernel (forgotten all at once past this)


def remember(cache: dict, key, value, limit: int = BINDINGS_PER_KERNEL) -> None:
    """cache[key] = value, forgetting every entry first when `limit` are kept (signatures rarely vary much)."""
    if len(cache) >= limit:
        cache.clear()
    cache[key] = value


def _binding_key(args: tuple):
    """What the checks of `bind` depend on, when every argument is a numpy array, a td.DeviceArray or a
    Python/numpy scalar: kinds, dtypes and shapes of the arrays, types and values of the scalars; else None."""
    key = []
    for a in args:
        if type(a) is DeviceArray:      # first: the arguments of launches that must be cheap
            key.append(a.launch_key)
        elif type(a) is np.ndarray:      # exactly: a subclass is bound as a plain view (`plain_arrays`)
            key.append((a.dtype, a.shape))
        elif type(a) is int:
            key.append((int, a))
        elif _is_float_scalar(a):       # by bits: -0.0 == 0.0 (but 1 / x differs), and a NaN is no NaN's equal
            key.append((type(a), _F64_BITS(a if type(a) is float else float(a))))
        elif _is_scalar(a):
            key.append((type(a), a))
        else:
            return None
    return tuple(key)


def _base_key(key: tuple, args: tuple, valued: frozenset) -> tuple:
    """`key` (a _binding_key of `args`) with the scalars' values left out, but those at the positions `valued`."""
    return tuple(type(a) if k not in valued and _is_scalar(a) else part
                 for k, (a, part) in enumerate(zip(args, key)))


_F64_BITS = struct.Struct("d").pack


def _is_scalar(value) -> bool:
    """Whether `value` is a Python or numpy number (ml_dtypes' bfloat16 and 8-bit floats included) or bool."""
    return isinstance(value, (bool, int, float)) or (isinstance(value, np.generic) and T.is_number_dtype(value.dtype))


def _is_float_scalar(value) -> bool:
    """Whether `value` is a Python or numpy float scalar (ml_dtypes' bfloat16 and 8-bit floats included)."""
    return isinstance(value, float) or (isinstance(value, np.generic) and T.is_float_dtype(value.dtype))


def plain_arrays(args: tuple) -> tuple:
    """`args` with numpy subclasses (np.matrix, masked arrays) as plain ndarray views of their memory."""
    return tuple(a.view(np.ndarray) if isinstance(a, np.ndarray) and type(a) is not np.ndarray else a for a in args)


def host_arrays(args: tuple) -> tuple:
    """`plain_arrays(args)` with other libraries' host arrays (torch CPU tensors) as numpy views of their memory
    (`arrays.host_view`): what the cpu target runs on."""
    return tuple(a if (view := host_view(a)) is None else view for a in plain_arrays(args))


@functools.cache
def _integer_range(dtype: np.dtype) -> tuple:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _array_value(spec, arg):
    """The array the kernel gets for an array argument (a numpy array of ml_dtypes' bfloat16 or 8-bit floats as its
    bits)."""
    name = T.ML_DTYPES_NAMES.get(spec.dtype.name)
    # (the spec first: a numpy dtype's .name costs a microsecond, and every array of a prepared call comes here)
    if name is not None and isinstance(arg, np.ndarray) and arg.dtype.name == name:
        return arg.view(spec.dtype.numpy)
    return arg


def _callable_names(spec, what: str, kernel: str) -> list:
    """The parameter names of a grid or block callable, which a launch passes by position; a TypeError for
    parameters it cannot pass so (keyword-only, *args, **kwargs)."""
    parameters = inspect.signature(spec).parameters.values()
    odd = [p for p in parameters if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if odd:
        raise TypeError(f"kernel '{kernel}': the {what} callable's parameter '{odd[0]}' ({odd[0].kind.description}) "
                        "cannot be passed; give it "
                        "plain parameters named after size symbols or scalar parameters (lambda N, M: ...)")
    return [p.name for p in parameters]


def _dims3(value, what: str, kernel: str) -> tuple:
    dims = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in dims):
        shown = ", ".join(ir.expr_str(d) if isinstance(d, ir.Expr) else repr(d) for d in dims)
        raise ValueError(f"kernel '{kernel}': {what} must be an int or a tuple of 1-3 ints, got ({shown})" + (
            ": it is computed on the host, from sizes and scalar parameters (threadIdx and blockIdx have no value "
            "there)" if any(isinstance(d, ir.Expr) for d in dims) else ""))
    dims = tuple(int(d) for d in dims) + (1,) * (3 - len(dims))
    low = 0 if what == "grid" else 1
    if any(d < low for d in dims):
        raise ValueError(f"kernel '{kernel}': {what} dims must be >= {low}, got {dims}")
    return dims


def _from_the_call(exc: DSLError) -> DSLError:
    """`exc` to raise from a kernel's public method: without the compiler's frames, which say nothing to the
    kernel's author (its message names the kernel's line and shows it); with them under TASKDSL_FULL_TRACEBACKS=1."""
    return exc if full_tracebacks_enabled() else exc.with_traceback(None)


def _short_traceback(method):
    """A public method (not the call: a launch pays for no wrapper) whose DSLErrors come `_from_the_call`."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except DSLError as exc:
            raise _from_the_call(exc)
    return wrapper


def _ir_params(function: ir.Function) -> list:
    """The (name, spec) of a kernel built from IR: a dim computed from symbols stays an expression, checked per
    call."""
    params = []
    for p in function.params:
        if isinstance(p, ir.Buffer):
            dims = tuple(d.value if isinstance(d, ir.Const) else d.name if isinstance(d, ir.Var) else d
                         for d in p.shape)
            params.append((p.name, T.TensorSpec(p.dtype, dims)))
        else:
            params.append((p.name, p.dtype))
    return params


class Kernel:
    """A `@td.kernel` function: call it on arrays to run it on the current target."""

    def __init__(self, fn, grid, block, name: str, params: list | None = None, build=None):
        """A kernel from Python function `fn`, or (fn=None) from `build(block) -> ir.Function` and its `params`."""
        from ..frontend.builder import build_function, kernel_params
        from ..frontend.global_reads import GlobalReads
        ir.allow_deep_trees()       # its IR is walked recursively (a generated kernel's expressions may nest deep)
        self.fn = fn
        self.name = name
        self.grid_spec = grid
        self.block_spec = block
        self.params = kernel_params(fn) if params is None else params
        self._global_reads = GlobalReads()   # the module-level names what is built read: rebinding one rebuilds
        self._build = build or (lambda b: build_function(fn, name, self.params, b, self._global_reads))
        self._callable_args = {what: _callable_names(spec, what, name) if callable(spec) else None
                               for what, spec in (("grid", grid), ("block", block))}
        self._lowered: dict = {}
        self._frontend: dict = {}
        self._stored: dict = {}     # block -> `_written`
        self._cpu: dict = {}
        self._cuda: dict = {}
        self._bindings: dict = {}    # _binding_key(args) -> (sizes, grid, block) of a call that passed the checks
        self._launches: dict = {}    # (_binding_key(args), debug, fast compile) -> PreparedLaunch (cpu)
        self._launch_bases: dict = {}    # as _launches, scalars by type only (but those grid and block read)
        names = set(self._callable_args["grid"] or ()) | set(self._callable_args["block"] or ())
        self._grid_scalars = frozenset(k for k, (n, spec) in enumerate(self.params)   # positions grid, block read
                                       if isinstance(spec, T.DataType) and n in names)
        self._cuda_launches: dict = {}   # _binding_key(args) -> PreparedCudaLaunch (device arrays and scalars)
        self._cuda_bases: dict = {}      # as _cuda_launches, scalars by type only (but those grid and block read)
        self._cuda_full_path: dict = {}  # base key (as _cuda_bases) -> True: arguments needing the full path each call
        # a cpu launch on arrays of fewer bytes than this runs on one thread: its blocks take less than handing them
        # out (a rule-based operator's kernel, whose work is its arrays' bytes: `launch.SERIAL_BYTES`)
        self.serial_below = 0
        self.shareable = False  # its constants may become size symbols, one compile serving its other shapes (`share`)
        self.share_checked = False  # whether `runtime.sharing` has looked for kernels it may share code with
        self._fixed_sizes: dict = {}     # size symbols no argument's shape gives: their values (`share`)
        if fn is not None:
            functools.update_wrapper(self, fn)
            follow_autoreload(Kernel)

    @classmethod
    def from_ir(cls, function: ir.Function, grid, streams: bool = False) -> "Kernel":
        """A kernel whose IR was built by a program (a scheduler), not written as Python; `streams`: its work is
        reading and writing its arrays once, and a launch on less than `launch.SERIAL_BYTES` of them is serial."""
        from ..backend.cpu.launch import SERIAL_BYTES
        kernel = cls(None, grid, function.block, function.name, _ir_params(function), build=lambda block: function)
        kernel.serial_below = SERIAL_BYTES if streams else 0
        return kernel

    def share(self, function: ir.Function, sizes: dict) -> None:
        """Run as `function` from now on: this kernel's IR with some constants made size symbols, shared with
        kernels of other shapes (`passes.generalize`); `sizes` gives the symbols' values for this kernel (those
        that name an axis of a parameter are checked against the arrays). Its arguments stay as they were."""
        if self.fn is not None or [n for n, _ in self.params] != [p.name for p in function.params]:
            raise ValueError(f"kernel '{self.name}' cannot run as '{function.name}': only a kernel built from IR "
                             "can, with the same parameters")
        self._forget_built()
        self.params = _ir_params(function)
        self._build = lambda block: function
        self._fixed_sizes = dict(sizes)

    def __repr__(self) -> str:
        sig = ", ".join(f"{n}: {s!r}" for n, s in self.params)
        return f"<td.kernel {self.name}({sig})>"

    # ------------------------------------------------------------------ binding
    def bind(self, args: tuple, target: str | None = None) -> Binding:
        """Check `args` against the annotations and bind the size symbols (device arrays too on 'cuda').

        Numpy arguments of shapes, dtypes and scalar values seen before skip the checks: the
        sizes, grid and block of that call are reused (a cpu launch's Python cost is mostly this).
        """
        target = target or get_target()
        if self._global_reads.noted and self._global_reads.rebound():
            self._forget_built()
        key = _binding_key(args)
        if key is not None:
            key = (key, target)         # a DeviceArray passes on cuda only
        known = self._bindings.get(key) if key is not None else None
        if known is not None:
            values = [self._bind_scalar(n, s, a) if isinstance(s, T.DataType) else _array_value(s, a)
                      for (n, s), a in zip(self.params, args)]
            return Binding(values, *known)
        binding = self._check(args, target)
        if key is not None:
            remember(self._bindings, key, (binding.sizes, binding.grid, binding.block))
        return binding

    def _check(self, args: tuple, target: str) -> Binding:
        if len(args) != len(self.params):
            raise TypeError(f"kernel '{self.name}' takes {len(self.params)} arguments "
                            f"({', '.join(n for n, _ in self.params)}), got {len(args)}")
        sizes: dict = dict(self._fixed_sizes)
        values = []
        derived: list = []     # dims that are expressions of size symbols, checked once all are bound
        for (pname, spec), arg in zip(self.params, args):
            if isinstance(spec, T.TensorSpec):
                values.append(self._bind_tensor(pname, spec, arg, sizes, target, derived))
            else:
                values.append(self._bind_scalar(pname, spec, arg))
        for pname, axis, dim, n in derived:
            if ir.evaluate_int(dim, sizes) != n:
                raise ValueError(f"kernel '{self.name}': axis {axis} of '{pname}' must be {ir.expr_str(dim)} = "
                                 f"{ir.evaluate_int(dim, sizes)}, got {n}")
        scalars = {n: v for (n, s), v in zip(self.params, values) if isinstance(s, T.DataType)}
        for spec in (self.grid_spec, self.block_spec):      # their results are kept per signature (`_bindings`)
            self._global_reads.note_code(spec)
        grid = _dims3(self._evaluate(self.grid_spec, sizes, scalars, "grid"), "grid", self.name)
        block = _dims3(self._evaluate(self.block_spec, sizes, scalars, "block"), "block", self.name)
        check_launch_dims(grid, block, kernel=self.name)    # on every target: a kernel tried on the cpu runs on a GPU
        return Binding(values, sizes, grid, block)

    def _bind_tensor(self, pname, spec: T.TensorSpec, arg, sizes: dict, target: str, derived: list):
        info = None
        if isinstance(arg, np.ndarray):
            arg = _array_value(spec, plain_arrays((arg,))[0])
            dtype, shape = arg.dtype, arg.shape
        elif target == "cuda":  # a GPU array (td.DeviceArray, torch, cupy, ...): passed to the kernel as it is
            from .device_array import array_info
            info = array_info(arg, f"kernel '{self.name}': argument '{pname}'")
            if info is None:    # another library's host array (a torch CPU tensor): as a numpy view of its memory
                return self._bind_tensor(pname, spec, host_view(arg), sizes, target, derived)
            dtype, shape = info.dtype, info.shape
            if T.ML_DTYPES_NAMES.get(spec.dtype.name) == dtype.name:
                dtype = spec.dtype.numpy
        elif isinstance(arg, DeviceArray):
            raise TypeError(f"kernel '{self.name}': argument '{pname}' is a td.DeviceArray (GPU memory), but the "
                            "target is cpu: copy it to the host with .numpy(), or run on the cuda target")
        elif (view := host_view(arg)) is not None:     # a torch CPU tensor...: as a numpy view of its memory
            return self._bind_tensor(pname, spec, view, sizes, target, derived)
        else:
            raise TypeError(f"kernel '{self.name}': argument '{pname}' must be a numpy array (or another host array "
                            f"with DLPack: a torch CPU tensor), got {type(arg).__name__}")
        if dtype != spec.dtype.numpy:
            wanted = T.ML_DTYPES_NAMES.get(spec.dtype.name, spec.dtype.numpy)     # not bf16's uint16 bits
            raise TypeError(f"kernel '{self.name}': argument '{pname}' must have dtype {wanted} "
                            f"({spec.dtype.name}), got {dtype}; convert it with "
                            + (conversion(arg, T.numpy_dtype(spec.dtype)) if info is None else
                               "stdlib_ops.cast (td.DeviceArray), .astype() (cupy) or .to(torch.<dtype>) (torch)"))
        if len(shape) != len(spec.dims):
            raise ValueError(f"kernel '{self.name}': argument '{pname}' must be {len(spec.dims)}-d ({spec!r}), "
                             f"got shape {shape}")
        for axis, (dim, n) in enumerate(zip(spec.dims, shape)):
            if isinstance(dim, str):
                if not T.i32.holds(n):      # size symbols are i32 (a GPU kernel would wrap it)
                    raise ValueError(f"kernel '{self.name}': size '{dim}' is {n} in '{pname}' (axis {axis}); size "
                                     "symbols are i32, so an axis holds at most 2^31 - 1 elements")
                if sizes.setdefault(dim, n) != n:
                    where = "from an earlier " + ("axis of this argument" if dim in spec.dims[:axis] else "argument")
                    raise ValueError(f"kernel '{self.name}': size '{dim}' is {sizes[dim]} {where} but {n} in "
                                     f"'{pname}' (axis {axis}, shape {shape})")
            elif isinstance(dim, ir.Expr):
                derived.append((pname, axis, dim, n))
            elif dim != n:
                raise ValueError(f"kernel '{self.name}': axis {axis} of '{pname}' must be {dim}, got shape {shape}")
        if info is not None and not info.c_contiguous:
            raise ValueError(f"kernel '{self.name}': argument '{pname}' is not C-contiguous (shape {shape}, strides "
                             f"{info.strides} bytes); GPU arrays are passed without copies, so make it contiguous "
                             "first: x.contiguous() (torch), cupy.ascontiguousarray(x)")
        return arg

    def _bind_scalar(self, pname, dtype: T.DataType, arg):
        if not _is_scalar(arg):
            raise TypeError(f"kernel '{self.name}': argument '{pname}' must be a scalar of type {dtype.name}, "
                            f"got {type(arg).__name__}")
        if dtype.is_integer and _is_float_scalar(arg):
            raise TypeError(f"kernel '{self.name}': argument '{pname}' must be an integer ({dtype.name}), got {arg!r}")
        if dtype.is_integer and not isinstance(arg, (bool, np.bool_)):
            low, high = _integer_range(dtype.numpy)
            if not low <= arg <= high:      # numpy would wrap it silently (or raise an OverflowError naming nothing)
                raise ValueError(f"kernel '{self.name}': argument '{pname}' = {arg} is outside the range of "
                                 f"{dtype.name} ({low} to {high}); declare the parameter with a wider type")
        value = arg if isinstance(arg, int) else float(arg) if dtype.is_float else None
        if dtype.is_float and (dtype.overflows(value) or (dtype.bits == 8 and math.isinf(value))):
            # numpy would give inf (or NaN), and a warning; an 8-bit float has no inf and would saturate one
            text = str(arg) if len(str(arg)) < 30 else f"an integer of {len(str(abs(arg)))} digits"
            becomes = "be inf" if dtype.bits > 8 else "saturate"
            advice = "declare the parameter with a wider type" if dtype.bits < 64 else "pass inf if you mean it"
            raise ValueError(f"kernel '{self.name}': argument '{pname}' = {text} is outside the range of "
                             f"{dtype.name} (it would {becomes}); {advice}")
        if dtype.name in T.ML_DTYPES_NAMES:     # values travel as their bits: bf16 3.0 is 0x4040, not 0x0003;
            return dtype.numpy.type(dtype.narrow_bits(arg))     # rounded once (ml_dtypes rounds an f64 to f32 first)
        return dtype.numpy.type(arg)

    def _evaluate(self, spec, sizes: dict, scalars: dict, what: str):
        if not callable(spec):
            return spec
        known = {**sizes, **scalars}
        names = self._callable_args[what]
        missing = [n for n in names if n not in known]
        if missing:
            raise ValueError(f"kernel '{self.name}': the {what} callable asks for {', '.join(map(repr, missing))}, "
                             f"which is not a size symbol or scalar parameter (known: {', '.join(known) or 'none'})")
        return spec(*(int(known[n]) if isinstance(known[n], (int, np.integer)) else known[n] for n in names))

    def _forget_built(self) -> None:
        """Forget everything built, once a module-level name it read is bound to another object: a call then
        builds with the new value, as a Python function reads its globals at each call (a notebook cell run
        again). The on-disk caches hold compiled code by IR, so returning to an earlier value loads it."""
        self._global_reads.clear()
        for built in (self._frontend, self._stored, self._lowered, self._cpu, self._cuda, self._bindings,
                      self._launches, self._launch_bases, self._cuda_launches, self._cuda_bases, self._cuda_full_path):
            built.clear()

    # ------------------------------------------------------------------ compilation stages
    def _frontend_ir(self, block: tuple) -> ir.Function:
        if block not in self._frontend:
            self._frontend[block] = self._build(block)
        return self._frontend[block]

    def _lowered_ir(self, block: tuple) -> ir.Function:
        if block not in self._lowered:
            from ..passes import lower
            self._lowered[block] = lower(self._frontend_ir(block))
        return self._lowered[block]

    def _cpu_kernel(self, block: tuple, debug: bool):
        fast, early = fast_compile_enabled(), cp_async_early_enabled()
        key = (block, debug, fast, early)
        if key not in self._cpu:
            from .cpu_modules import cpu_module, entry_function
            src, path = cpu_module(self._frontend_ir(block), lambda: self._lowered_ir(block), debug, fast, early)
            function, path = entry_function(src, path)
            self._cpu[key] = (function, src, path)
        return self._cpu[key]

    def _cuda_function(self, binding: Binding) -> ir.Function:
        from ..passes import lower_for_cuda
        return lower_for_cuda(self._lowered_ir(binding.block), binding.sizes)

    # ------------------------------------------------------------------ public API
    def arguments(self, args: tuple, kwargs: dict) -> tuple:
        """Positional and keyword arguments as one tuple in parameter order, defaults filled in (as Python
        binds a call)."""
        if not kwargs and (len(args) == len(self.params) or self.fn is None):
            return args     # a count mismatch is reported by the checks
        names = ", ".join(n for n, _ in self.params)
        if self.fn is None:   # built from IR: its parameter names need not be Python identifiers
            raise TypeError(f"kernel '{self.name}' takes positional arguments only ({names})")
        unknown = [k for k in kwargs if k not in dict(self.params)]
        if unknown:         # (bind would report the parameter left without a value first)
            raise TypeError(f"kernel '{self.name}' takes {len(self.params)} arguments ({names}): got an unexpected "
                            f"keyword argument {unknown[0]!r}")
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"kernel '{self.name}' takes {len(self.params)} arguments "
                            f"({', '.join(n for n, _ in self.params)}): {exc}") from None
        bound.apply_defaults()
        return bound.args

    def __call__(self, *args, **kwargs) -> None:
        try:        # (free in Python 3.11+ when nothing is raised)
            args = self.arguments(args, kwargs)
            if self._global_reads.noted and self._global_reads.rebound():     # (inline: a launch's cost)
                self._forget_built()
            if get_target() == "cpu":
                self._call_cpu(args)
            else:
                self._call_cuda(args)
        except DSLError as exc:
            raise _from_the_call(exc)

    def _call_cuda(self, args: tuple) -> None:
        """Launch on a GPU: a call whose arguments are td.DeviceArrays and scalars of the signature of an
        earlier one reuses its prepared launch (no checks: a few microseconds of Python); any other call
        binds, checks and launches in full (numpy arrays are copied in and back)."""
        key = _binding_key(args)
        if key is None:
            args = plain_arrays(args)
        prepared = self._cuda_launches.get(key) if key is not None else None
        if prepared is not None:
            prepared(args)
            return
        base_key = None if key is None else _base_key(key, args, self._grid_scalars)
        prepared = self._cuda_bases.get(base_key) if base_key is not None else None
        if prepared is not None:        # new values of scalars alone: checked, then that launch (`_new_cpu_launch`)
            scalars = self._bound_scalars(args)
            remember(self._cuda_launches, key, prepared)
            prepared([scalars.get(k, a) for k, a in enumerate(args)])
            return
        binding = self.bind(args, "cuda")
        if 0 in binding.grid:
            return
        if key is not None and base_key not in self._cuda_full_path:     # the first call of this signature
            prepared = self._prepare_cuda(binding)
            if prepared is None:        # (the kinds of the arguments decide it, not the scalars' values)
                remember(self._cuda_full_path, base_key, True)
            else:
                remember(self._cuda_launches, key, prepared)
                remember(self._cuda_bases, base_key, prepared)
        if prepared is not None:
            prepared(binding.values)
        else:       # (numpy arrays among the arguments, each copied to the GPU on its own: none may overlap)
            check_host_arrays_apart(binding.values, self._written(binding.block), self.name,
                                    tuple(name for name, _ in self.params))
            self._run_cuda(binding)

    def _cuda_launch(self, binding: Binding) -> tuple:
        """(compiled kernel, symbol, parameter dtypes) of a cuda launch of `binding`, compiled for this device."""
        from ..backend.cuda.launch import device_state
        compiled = self._compiled_cuda(binding, device_state().arch)   # the device's exact sm_XY
        dtypes = [spec.dtype if isinstance(spec, T.TensorSpec) else spec for _, spec in self.params]
        return compiled, compiled.symbol, dtypes

    def _prepare_cuda(self, binding: Binding):
        """The PreparedCudaLaunch of `binding`, or None when its arguments need work at every call."""
        from ..backend.cuda.launch import prepare_cuda
        compiled, symbol, dtypes = self._cuda_launch(binding)
        return prepare_cuda(compiled, symbol, binding.values, binding.grid, binding.block, dtypes)

    def _run_cuda(self, binding: Binding) -> None:
        from ..backend.cuda.launch import launch_cuda
        compiled, symbol, dtypes = self._cuda_launch(binding)
        launch_cuda(compiled, symbol, binding.values, binding.grid, binding.block, dtypes)

    def _call_cpu(self, args: tuple) -> None:
        """Launch on the cpu: a call with the shapes, dtypes and scalars of an earlier one reuses its
        prepared launch (no checks, no lookups: a launch's Python cost is mostly these)."""
        debug = debug_enabled()
        key = _binding_key(args)
        if key is None:
            args = host_arrays(args)
            key = _binding_key(args)        # (numpy views: the prepared launch of their shapes serves them)
        if key is not None:
            key = (key, debug, fast_compile_enabled(), cp_async_early_enabled())
        launch = self._launches.get(key)
        if launch is None or precompile.is_recording():
            launch = self._new_cpu_launch(args, key, debug)
            if launch is None:
                return
        try:
            launch(args)
        except (IndexError, RuntimeError) as exc:
            sites = launch.src.sites
            if debug and exc.args and isinstance(exc.args[0], int) and exc.args[0] < len(sites):
                from ..backend.cpu.errors import debug_error
                raise debug_error(sites[exc.args[0]], exc) from None
            raise

    def _new_cpu_launch(self, args: tuple, key, debug: bool):
        """The prepared launch of a call `_launches` does not know (None when there is nothing to run, or launches
        are being recorded). A call that differs from an earlier one in the values of scalars alone (which the grid
        and block do not read) reuses that one's launch with its scalars bound anew: a scalar changing at each call
        took the whole path each time (~0.1 ms)."""
        recording = precompile.is_recording()
        base_key = None if key is None else (_base_key(key[0], args, self._grid_scalars), *key[1:])
        base = self._launch_bases.get(base_key) if base_key is not None and not recording else None
        if base is not None:
            launch = base.with_scalars(self._bound_scalars(args))
        else:
            if self.shareable and not self.share_checked and not recording:     # (a fused kernel's block is fixed)
                share_with_earlier(self, _dims3(self.block_spec, "block", self.name))
            binding = self.bind(args, "cpu")
            if 0 in binding.grid:        # nothing to run, and nothing to compile
                return None
            launch = self._prepare_cpu(binding, debug)
            if launch is None:
                return None
            if base_key is not None:
                remember(self._launch_bases, base_key, launch)
        if key is not None:
            remember(self._launches, key, launch)
        return launch

    def _bound_scalars(self, args: tuple) -> dict:
        """{position: value} of the scalar arguments, checked and converted as `bind` does."""
        return {k: self._bind_scalar(n, spec, a) for k, ((n, spec), a) in enumerate(zip(self.params, args))
                if isinstance(spec, T.DataType)}

    def _prepare_cpu(self, binding: Binding, debug: bool):
        """The prepared launch of `binding` (None while launches are being recorded for compiling ahead)."""
        from ..backend.cpu.launch import PreparedLaunch, runs_apart, signatures
        from .cpu_modules import outlined_addresses, outlined_jobs
        if precompile.is_recording() and precompile.collected(self, binding.block):
            return None
        run, src, path = self._cpu_kernel(binding.block, debug)
        sizes = [binding.sizes[s.name] for s in self._frontend_ir(binding.block).sizes]   # `lower` keeps them
        written = self._written(binding.block)
        if precompile.is_recording():
            types, launcher = signatures(src, binding.values, sizes, binding.grid)
            apart = runs_apart(src, binding.values, written)
            precompile.record(precompile.Job(str(path), src.entry, types, src.opt_level, apart, launcher))
            for job in outlined_jobs(src):
                precompile.record(job)
            return None
        if len(src.addresses) < len(src.outlined):
            src.addresses = outlined_addresses(src)
        return PreparedLaunch(run, src, binding.values, sizes, binding.grid, written, self.name, self.serial_below,
                              tuple(name for name, _ in self.params))

    def _written(self, block: tuple) -> dict:
        """{parameter index: name} of the arrays the kernel stores to (or updates atomically); walked once per block
        (a graph's compile prepared a fused kernel's launches hundreds of times, each walk 1-2 ms)."""
        if block not in self._stored:
            fn = self._frontend_ir(block)
            stored = {s.buffer.uid for s in ir.collect(fn.body, ir.Store, expressions=False)}
            stored |= {a.buffer.uid for a in ir.collect(fn.body, ir.Atomic)}
            self._stored[block] = {k: p.name for k, p in enumerate(fn.params)
                                   if isinstance(p, ir.Buffer) and p.uid in stored}
        return self._stored[block]

    @_short_traceback
    def ir(self, *args, stage: str = "frontend", **kwargs) -> str:
        """The IR text of the specialization for the arguments (as a call takes them): stage 'frontend',
        'lowered' or 'cuda'."""
        binding = self.bind(self.arguments(args, kwargs))
        if stage == "frontend":
            return ir.function_str(self._frontend_ir(binding.block))
        if stage == "lowered":
            return ir.function_str(self._lowered_ir(binding.block))
        if stage == "cuda":
            return ir.function_str(self._cuda_function(binding))
        raise ValueError(f"unknown stage {stage!r}; use 'frontend', 'lowered' or 'cuda'")

    @_short_traceback
    def source(self, *args, target: str | None = None, **kwargs) -> str:
        """The generated source for the arguments (as a call takes them): CUDA C++ (target='cuda') or the numba
        module (target='cpu')."""
        target = target or get_target()
        binding = self.bind(self.arguments(args, kwargs), target)
        if target == "cuda":
            from ..backend.cuda.codegen import emit_cuda
            return emit_cuda(self._cuda_function(binding))
        if target == "cpu":
            return self._cpu_kernel(binding.block, debug_enabled())[1].listing()
        raise ValueError(f"unknown target {target!r}; use 'cpu' or 'cuda'")

    def _compiled_cuda(self, binding: Binding, arch: str) -> CompiledKernel:
        from ..backend.cuda.nvrtc import normalize_arch
        arch = normalize_arch(arch)
        fast = fast_compile_enabled()
        key = (binding.block, tuple(sorted(binding.sizes.items())), arch, fast)
        if key not in self._cuda:   # in-memory dispatch: a repeated call hashes nothing
            from .cuda_modules import compiled_cuda
            self._cuda[key] = compiled_cuda(self._frontend_ir(binding.block), binding.sizes, arch, fast,
                                            lambda: self._cuda_function(binding), self.name)
        return self._cuda[key]

    @_short_traceback
    def compile(self, *args, target: str | None = None, arch: str | None = None, **kwargs) -> CompiledKernel:
        """Compile the specialization for `args` without running it (cuda: a cubin for `arch`, default sm_90)."""
        target = target or get_target()
        binding = self.bind(self.arguments(args, kwargs), target)
        if target == "cuda":
            return self._compiled_cuda(binding, arch or "sm_90")
        if target == "cpu":
            src = self._cpu_kernel(binding.block, debug_enabled())[1]
            return CompiledKernel("cpu", src.listing())
        raise ValueError(f"unknown target {target!r}; use 'cpu' or 'cuda'")


__all__ = ["Kernel", "CompiledKernel"]
