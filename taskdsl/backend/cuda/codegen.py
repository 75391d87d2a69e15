"""IR -> CUDA C++ (one `extern "C" __global__` function per kernel).

Expects a kernel lowered by `passes.lower_for_cuda` (constant sizes, 1-D addressing).
Every statement is preceded by a `#line` directive naming the user's Python line, so
NVRTC diagnostics, -lineinfo, compute-sanitizer and profilers point at Python.
`//` and `%` keep Python's floor semantics; they compile to plain `/` and `%` where
the operands are provably non-negative (the common case of index arithmetic).
"""
from __future__ import annotations

import math

from ... import ir
from ...ir import types as T
from ...passes.bounds import int_range
from ...passes.simplify import single_assignments
from ..naming import CPP_KEYWORDS, CPP_MACROS, NameTable, identifier

# Helpers, each emitted only when the kernel uses it.
_HELPERS = {
    # cuda_fp8.h converts an f64 NaN to the NaN of its sign (E5M2: and payload), an f32 one to 0x7F: the f32's, so
    # that a NaN converts alike from every type (the cpu target's rule)
    "td_fp8_of_f64": """template <typename T> __device__ __forceinline__ T td_fp8_of_f64(double x) {
  return x == x ? T(x) : T(__int_as_float(0x7fffffff)); }""",
    # an 8-bit float from its byte (a shuffle moves one as an int: CUDA has no shuffle of cuda_fp8.h's types)
    "td_fp8_of_bits": """template <typename T> __device__ __forceinline__ T td_fp8_of_bits(int bits) {
  T r; r.__x = (decltype(r.__x))bits; return r; }""",
    "td_floordiv": """template <typename T> __device__ __forceinline__ T td_floordiv(T a, T b) {
  T q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }""",
    "td_floormod": """template <typename T> __device__ __forceinline__ T td_floormod(T a, T b) {
  T r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }""",
    # Python's float // and % (CPython's float divmod, as numba and numpy compute them): exact through fmod,
    # where floor(a / b) would round first (1.0 // 0.1f: the quotient 9.9999998 rounds to 10.0f).
    "td_pymod": """template <typename T> __device__ __forceinline__ T td_pymod(T a, T b) {
  T m = fmod(a, b);
  if (m == T(0)) return copysign(T(0), b);
  return ((b < T(0)) != (m < T(0))) ? m + b : m; }""",
    "td_pyfloordiv": """template <typename T> __device__ __forceinline__ T td_pyfloordiv(T a, T b) {
  if (b == T(0)) return a / b;      // numpy's inf, -inf or nan (CPython would raise)
  T m = fmod(a, b), d = (a - m) / b;
  if (m != T(0) && ((b < T(0)) != (m < T(0)))) d -= T(1);
  if (d == T(0)) return copysign(T(0), a / b);
  T f = floor(d); return (d - f > T(0.5)) ? f + T(1) : f; }""",
    # a float to an integer type: truncated, clamped to [low, high] (lo, hi: low and high + 1 as floats), NaN giving
    # 0 (DataType.saturate; PTX's cvt.rzi). A C cast is undefined where the value does not fit: compilers may drop
    # the code around one they can prove does not.
    "td_float_to_int": """template <typename I, typename F> __device__ __forceinline__ I td_float_to_int(F v, F lo, F hi, I low, I high) {
  return v < lo ? low : v >= hi ? high : v == v ? (I)v : (I)0; }""",
    # a select whose operands are both evaluated (ir.Select.eager): as a call's arguments, so no branch skips one
    "td_select": """template <typename T> __device__ __forceinline__ T td_select(bool c, T a, T b) { return c ? a : b; }""",
    # max / min as the cpu target (support.fmax / fmin) computes them, IEEE 754's maximum / minimum: a NaN operand
    # gives NaN, and -0 is below +0, so the result does not depend on the operands' order (where b is a zero or a
    # NaN is there, max is `larger + b`, min `-(-smaller - b)`). fmaxf / fminf would drop the NaN: relu(NaN) would
    # be 0 where numpy, PyTorch and onnxruntime give NaN.
    "td_max": """template <typename T> __device__ __forceinline__ T td_max(T a, T b) {
  T larger = b > a ? b : a; return (b == b && b != T(0)) ? larger : T(larger + b); }""",
    "td_min": """template <typename T> __device__ __forceinline__ T td_min(T a, T b) {
  T smaller = b < a ? b : a; return (b == b && b != T(0)) ? smaller : T(-(-smaller - b)); }""",
    # a NaN to 0 and -0.0 to 0.0 (the graph's nan_to_zero: an integral float cast to an integer type and back), its
    # operand written once where `x == x ? x + 0 : 0` writes it three times (nested: 3^depth in a QDQ epilogue)
    "td_nan_to_zero": """template <typename T> __device__ __forceinline__ T td_nan_to_zero(T x) {
  return x == x ? T(x + T(0)) : T(0); }""",
    "td_atomic_rmw": """// Read-modify-write by compare-and-swap, for atomics CUDA has no instruction for.
template <int N> struct td_uint;
template <> struct td_uint<4> { typedef unsigned int type; };
template <> struct td_uint<8> { typedef unsigned long long type; };
template <typename T, typename Op> __device__ __forceinline__ T td_atomic_rmw(T* p, T v, Op op) {
  typedef typename td_uint<sizeof(T)>::type U;  // atomics need 32- or 64-bit elements
  U* up = reinterpret_cast<U*>(p); U old = *up, assumed;
  do { assumed = old; T cur; memcpy(&cur, &assumed, sizeof(T)); T next = op(cur, v); U bits;
       memcpy(&bits, &next, sizeof(T)); old = atomicCAS(up, assumed, bits); } while (assumed != old);
  T result; memcpy(&result, &old, sizeof(T)); return result; }""",
    "td_get_b32": """// Two neighbouring 16-bit elements (four 8-bit ones) of a register array (4-byte aligned) as
// one 32-bit register, the first in the low bits (mma, ldmatrix); whole-word copies, not halves shifted and
// masked: ptxas then keeps the fragments in 32-bit registers as the instructions use them
template <typename T> __device__ __forceinline__ unsigned td_get_b32(const T& first) {
  unsigned r; memcpy(&r, &first, 4); return r; }""",
    "td_set_b32": """template <typename T> __device__ __forceinline__ void td_set_b32(T& first, unsigned r) {
  memcpy(&first, &r, 4); }""",
}

# PTX's names of the tensor cores' operand and accumulator types
_PTX_TYPES = {"f16": "f16", "bf16": "bf16", "f8e4m3": "e4m3", "f8e5m2": "e5m2", "i8": "s8", "u8": "u8", "f32": "f32",
              "i32": "s32"}

_F32_MATH = {"exp": "expf", "exp2": "exp2f", "log": "logf", "log2": "log2f", "sqrt": "sqrtf", "rsqrt": "rsqrtf",
             "sin": "sinf", "cos": "cosf", "tanh": "tanhf", "asin": "asinf", "acos": "acosf", "atan": "atanf",
             "sinh": "sinhf", "cosh": "coshf", "asinh": "asinhf", "acosh": "acoshf", "atanh": "atanhf",
             "erf": "erff", "abs": "fabsf", "floor": "floorf",
             "ceil": "ceilf", "rint": "rintf", "pow": "powf", "fma": "fmaf"}
_SHUFFLES = {"shfl_xor": "__shfl_xor_sync", "shfl_down": "__shfl_down_sync", "shfl_up": "__shfl_up_sync",
             "shfl_idx": "__shfl_sync"}
_C_OPS = {"and": "&&", "or": "||"}
# (op, dtype) pairs CUDA has an atomic instruction for (sm_60+); others go through td_atomic_rmw.
_NATIVE_ATOMICS = {("add", t) for t in ("i32", "u32", "u64", "f32", "f64")} | {("sub", t) for t in ("i32", "u32")} | \
    {(op, t) for op in ("max", "min") for t in ("i32", "u32", "i64", "u64")} | \
    {("exch", t) for t in ("i32", "u32", "u64", "f32")}
# Identifiers generated code calls or CUDA defines: variables and buffers must not shadow them.
_C_RESERVED = set(_F32_MATH.values()) | {name[:-1] for name in _F32_MATH.values()} | set(_SHUFFLES.values()) | {
    "llabs", "abs", "max", "min", "threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize", "atomicAdd",
    "atomicSub", "atomicMax", "atomicMin", "atomicExch", "atomicCAS", "memcpy", "half", "__syncwarp",
    "__cvta_generic_to_shared", "td_r", "td_dynamic_smem"} | set(_HELPERS) | CPP_KEYWORDS | CPP_MACROS
# C functions NVRTC declares in every program (C's math library, f32 forms included, CUDA's additions to it, and
# the C library's device functions): a kernel of one of these names, an `extern "C"` function, would redeclare it
_C_MATH = ("acos asin atan atan2 cos sin tan acosh asinh atanh cosh sinh tanh exp exp2 exp10 expm1 frexp ldexp log "
           "log10 log1p log2 logb ilogb modf scalbn scalbln cbrt fabs hypot pow sqrt rsqrt rcbrt erf erfc erfinv "
           "erfcinv lgamma tgamma ceil floor nearbyint rint lrint llrint round lround llround trunc fmod remainder "
           "remquo copysign nan nextafter fdim fmax fmin fma sincos sinpi cospi sincospi normcdf normcdfinv j0 j1 "
           "jn y0 y1 yn cyl_bessel_i0 cyl_bessel_i1 norm norm3d norm4d rnorm rnorm3d rnorm4d rhypot fdivide "
           "isfinite isinf isnan signbit").split()
_C_LIBRARY = {name + suffix for name in _C_MATH for suffix in ("", "f")} | {
    "main", "printf", "malloc", "free", "memset", "memcpy", "assert", "clock", "clock64", "labs", "llabs",
    "llmin", "llmax", "umin", "umax", "ullmin", "ullmax"}
# the new value from the old one `a` and the operand `b` (max / min as td_max / td_min: a NaN kept)
_RMW_OPS = {"add": "a + b", "sub": "a - b", "max": "td_max(a, b)", "min": "td_min(a, b)", "exch": "b"}


STATIC_SHARED_LIMIT = 48 * 1024   # bytes of static __shared__ a kernel may declare


def _shared_layout(allocations: list) -> tuple[dict, int]:
    """(buffer uid -> byte offset, total bytes) of the shared buffers, each 16-byte aligned."""
    offsets, total = {}, 0
    for alloc in allocations:
        b = alloc.buffer
        if b.scope == "shared" and b.uid not in offsets:
            offsets[b.uid] = total
            total += -(-math.prod(d.value for d in b.shape) * max(1, b.dtype.bits // 8) // 16) * 16
    return offsets, total


def dynamic_shared_bytes(fn: ir.Function) -> int:
    """Dynamic shared memory the launch must provide: all shared buffers when they exceed 48 KiB, else 0."""
    return _dynamic_bytes(_shared_layout(ir.collect(fn.body, ir.Allocate, expressions=False))[1])


def _dynamic_bytes(shared_total: int) -> int:
    return shared_total if shared_total > STATIC_SHARED_LIMIT else 0


def emit_cuda(fn: ir.Function) -> str:
    """The CUDA C++ translation unit of a lowered, size-bound, flattened kernel."""
    return _CudaEmitter(fn).emit()


def kernel_symbol(fn: ir.Function) -> str:
    """The C name of a kernel's `__global__` function (a Python name such as `double`, `main` or `sinf` gets a
    suffix, as does a name C++ reserves: `__x`, `_X`)."""
    name = identifier(fn.name)
    reserved = name in _C_RESERVED or name in _C_LIBRARY or name.startswith("__") or \
        (name[0] == "_" and name[1:2].isupper())
    return f"{name}_kernel" if reserved or name[0].isdigit() else name


def _c_float(value: float, dtype: T.DataType) -> str:
    if math.isnan(value):
        return "__int_as_float(0x7fffffff)" if dtype.bits == 32 else "__longlong_as_double(0x7ff8000000000000LL)"
    if math.isinf(value):
        bits = ("0x7f800000" if value > 0 else "0xff800000") if dtype.bits == 32 else \
            ("0x7ff0000000000000LL" if value > 0 else "0xfff0000000000000LL")
        return f"__int_as_float({bits})" if dtype.bits == 32 else f"__longlong_as_double({bits})"
    return dtype.float_text(value) + ("f" if dtype.bits == 32 else "")


def _power_of_two(e: ir.Expr) -> int | None:
    """k when `e` is the integer constant 2**k (k >= 1), else None."""
    if isinstance(e, ir.Const) and e.dtype.is_integer and not isinstance(e.value, bool):
        value = int(e.value)
        if value > 1 and value & (value - 1) == 0:
            return value.bit_length() - 1
    return None


def _changes_in(e: ir.Expr, body: ir.Stmt) -> bool:
    """Whether `e` may read another value once `body` has run: it reads memory (this thread's stores or another's),
    or a variable `body` assigns."""
    if ir.collect(e, (ir.Load, ir.Atomic)):
        return True
    reads = {v.uid for v in ir.collect(e, ir.Var) if v.kind not in ("param", "size")}
    return bool(reads) and any(a.var.uid in reads for a in ir.collect(body, ir.Assign, expressions=False))


class _CudaEmitter:
    def __init__(self, fn: ir.Function):
        self.fn = fn
        self.name = NameTable(_C_RESERVED)
        self.single = single_assignments(fn.body)
        self.lines: list = []
        self.ranges: dict = {}
        self.last_line = None
        # one walk of the (often unrolled, 10^5-node) body for every statement class the emitter looks up, and for
        # the widths of 16- and 8-bit float values anywhere (a cast or a local value needs their headers too)
        self.found = {cls: [] for cls in (ir.Allocate, ir.Store, ir.Atomic, ir.For, ir.Assign)}
        narrow = set()
        for node in ir.collect(fn.body, tuple(self.found) + (ir.Expr,)):
            if type(node) in self.found:
                self.found[type(node)].append(node)
            if isinstance(node, ir.Expr) and node.dtype.computes_in_f32:
                narrow.add(node.dtype.bits)
        typed = [*fn.buffers, *fn.scalars, *(a.buffer for a in self.found[ir.Allocate])]
        self.narrow_float_bits = narrow | {x.dtype.bits for x in typed if x.dtype.computes_in_f32}

    # ------------------------------------------------------------------ top level
    def emit(self) -> str:
        fn = self.fn
        stored = {s.buffer.uid for s in self.found[ir.Store] + self.found[ir.Atomic]}
        params = []
        for p in fn.params:
            if isinstance(p, ir.Buffer):
                const = "" if p.uid in stored else "const "
                params.append(f"{const}{p.dtype.c_name}* __restrict__ {self.name(p)}")
            else:
                params.append(f"{p.dtype.c_name} {self.name(p)}")
        head = [f"// {fn.name}: generated by taskdsl from {fn.source_file}"]
        if 16 in self.narrow_float_bits:
            head.append("#include <cuda_fp16.h>\n#include <cuda_bf16.h>")
        if 8 in self.narrow_float_bits:
            head.append("#include <cuda_fp8.h>")
        self.lines.append(f'extern "C" __global__ void __launch_bounds__({fn.num_threads}) '
                          f"{kernel_symbol(fn)}({', '.join(params)}) {{")
        offsets, shared_total = _shared_layout(self.found[ir.Allocate])
        dynamic = _dynamic_bytes(shared_total) > 0   # past 48 KiB, shared memory must be dynamic
        if dynamic:
            self.lines.append("  extern __shared__ __align__(16) unsigned char td_dynamic_smem[];")
        declared = set()
        for alloc in self.found[ir.Allocate]:  # Python scoping: buffers live function-wide
            b = alloc.buffer
            if b.uid in declared:
                continue
            declared.add(b.uid)
            size = math.prod(d.value for d in b.shape)
            if b.scope == "shared" and dynamic:
                self.lines.append(f"  {b.dtype.c_name}* {self.name(b)} = "
                                  f"reinterpret_cast<{b.dtype.c_name}*>(td_dynamic_smem + {offsets[b.uid]});")
            else:
                # 16-byte aligned shared arrays: neighbouring elements a thread reads can become one vector load
                qualifier = "__shared__ __align__(16) " if b.scope == "shared" else ""
                if b.scope == "register" and b.dtype.bits < 32:
                    qualifier = "__align__(4) "     # fragments are read and written as words (td_get_b32)
                self.lines.append(f"  {qualifier}{b.dtype.c_name} {self.name(b)}[{size}];")
        for_vars = {f.var.uid for f in self.found[ir.For]}  # declared by their for statement
        local_vars = {a.var.uid: a.var for a in self.found[ir.Assign] if a.var.uid not in for_vars}
        for v in local_vars.values():
            self.lines.append(f"  {v.dtype.c_name} {self.name(v)};")
        self.stmt(fn.body, 1)
        self.lines.append("}")
        body = "\n".join(self.lines)
        head += [code for name, code in _HELPERS.items() if name + "(" in body or name + "<" in body]
        return "\n".join(head) + "\n" + body + "\n"

    # ------------------------------------------------------------------ statements
    def line_directive(self, s: ir.Stmt) -> None:
        if s.loc is not None and s.loc.line != self.last_line:
            # a C string that ptxas takes too (-lineinfo puts it in the PTX, whose strings have no escaped quote)
            file = s.loc.file.replace("\\", "\\\\").replace('"', "'")
            self.lines.append(f'#line {s.loc.line} "{file}"')
            self.last_line = s.loc.line

    def stmt(self, s: ir.Stmt, depth: int) -> None:
        pad = "  " * depth
        if isinstance(s, ir.Seq):
            for x in s.stmts:
                self.stmt(x, depth)
            return
        if isinstance(s, ir.Allocate):
            return
        self.line_directive(s)
        if isinstance(s, ir.Assign):
            self.lines.append(f"{pad}{self.name(s.var)} = {self.expr(s.value)};")
            value_range = int_range(s.value, self.fn.block, self.ranges)
            if s.var.uid in self.single and value_range is not None:
                self.ranges[s.var.uid] = value_range
        elif isinstance(s, ir.Store):
            self.lines.append(f"{pad}{self.name(s.buffer)}[{self.expr(s.indices[0])}] = {self.expr(s.value)};")
        elif isinstance(s, ir.Evaluate):
            self.lines.append(f"{pad}{self.expr(s.expr)};")
        elif isinstance(s, ir.For):
            self.emit_for(s, depth)
        elif isinstance(s, ir.While):
            self.lines.append(f"{pad}while ({self.expr(s.cond)}) {{")
            self.stmt(s.body, depth + 1)
            self.lines.append(f"{pad}}}")
        elif isinstance(s, ir.If):
            self.lines.append(f"{pad}if ({self.expr(s.cond)}) {{")
            self.stmt(s.then, depth + 1)
            if s.orelse is not None:
                self.lines.append(f"{pad}}} else {{")
                self.stmt(s.orelse, depth + 1)
            self.lines.append(f"{pad}}}")
        elif isinstance(s, ir.Break):
            self.lines.append(f"{pad}break;")
        elif isinstance(s, ir.Continue):
            self.lines.append(f"{pad}continue;")
        elif isinstance(s, ir.SyncThreads):
            self.lines.append(f"{pad}__syncthreads();")
        elif isinstance(s, ir.SyncWarp):
            self.lines.append(f"{pad}__syncwarp({self.warp_mask()});")
        elif isinstance(s, ir.Mma):
            self.mma(s, pad)
        elif isinstance(s, ir.LdMatrix):
            self.ldmatrix(s, pad)
        elif isinstance(s, ir.CpAsync):
            self.cp_async(s, pad)
        elif isinstance(s, ir.Prefetch):
            self.lines.append(f'{pad}asm volatile("prefetch.global.L2 [%0];" :: "l"(__cvta_generic_to_global('
                              f'&{self.element(s.src)})));')
        elif isinstance(s, ir.CpAsyncCommit):
            self.lines.append(f'{pad}asm volatile("cp.async.commit_group;" ::: "memory");')
        elif isinstance(s, ir.CpAsyncWait):
            self.lines.append(f'{pad}asm volatile("cp.async.wait_group {s.pending};" ::: "memory");')
        else:
            raise AssertionError(f"emit_cuda: unexpected statement {type(s).__name__}")

    def emit_for(self, s: ir.For, depth: int) -> None:
        pad = "  " * depth
        v, step = self.name(s.var), s.step.value
        cmp = "<" if step > 0 else ">"
        if s.unroll:
            self.lines.append(f"{pad}#pragma unroll")
        init, stop = f"{v} = {self.expr(s.start)}", self.expr(s.stop)
        if _changes_in(s.stop, s.body):     # range() reads its stop once; a C for loop tests it each time round
            end = self.name.derived(("end", s.var.uid), f"{v}_end")
            init, stop = f"{init}, {end} = {stop}", end
        self.lines.append(f"{pad}for ({s.var.dtype.c_name} {init}; {v} {cmp} {stop}; {v} += {step}) {{")
        lo, hi = int_range(s.start, self.fn.block, self.ranges), int_range(s.stop, self.fn.block, self.ranges)
        if step > 0 and lo is not None and hi is not None:
            self.ranges[s.var.uid] = (lo[0], max(lo[0], hi[1] - 1))
        self.stmt(s.body, depth + 1)
        self.lines.append(f"{pad}}}")

    # ------------------------------------------------------------------ tensor cores and async copies
    def element(self, ref: ir.Ref, k: int = 0) -> str:
        """The `k`-th element after a flattened Ref, as a C lvalue."""
        i = ref.indices[0]
        i = ir.const(i.value + k, i.dtype) if isinstance(i, ir.Const) else i + k if k else i
        return f"{self.name(ref.buffer)}[{self.expr(i)}]"

    def shared_address(self, ref: ir.Ref) -> str:
        return f"(unsigned)__cvta_generic_to_shared(&{self.element(ref)})"

    def mma(self, s: ir.Mma, pad: str) -> None:
        per = 32 // s.a.dtype.bits     # operand elements in a 32-bit register
        a, b, c = (_PTX_TYPES[ref.dtype.name] for ref in (s.a, s.b, s.c))
        pairs = [(s.a, r) for r in range(4)] + [(s.b, r) for r in range(2)]
        inputs = ", ".join(f'"r"(td_get_b32({self.element(f, per * r)}))' for f, r in pairs)
        constraint = "+f" if s.c.dtype.is_float else "+r"
        accumulators = ", ".join(f'"{constraint}"({self.element(s.c, i)})' for i in range(4))
        self.lines += [f'{pad}asm volatile("mma.sync.aligned.m16n8k{s.k}.row.col.{c}.{a}.{b}.{c} '
                       '{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"',
                       f"{pad}    : {accumulators}", f"{pad}    : {inputs});"]

    def ldmatrix(self, s: ir.LdMatrix, pad: str) -> None:
        n, per = s.num, 32 // s.frag.dtype.bits
        registers = ", ".join(f"%{r}" for r in range(n))
        outputs = ", ".join(f'"=r"(td_r[{r}])' for r in range(n))
        self.lines += [f"{pad}{{", f"{pad}  unsigned td_r[{n}];",
                       f'{pad}  asm volatile("ldmatrix.sync.aligned.m8n8.x{n}{".trans" if s.trans else ""}.shared.b16 '
                       f'{{{registers}}}, [%{n}];"',
                       f'{pad}      : {outputs} : "r"({self.shared_address(s.src)}) : "memory");']
        self.lines += [f"{pad}  td_set_b32({self.element(s.frag, per * r)}, td_r[{r}]);" for r in range(n)]
        self.lines.append(f"{pad}}}")

    def cp_async(self, s: ir.CpAsync, pad: str) -> None:
        size = s.count * s.dst.dtype.bits // 8
        pred = self.expr(s.pred)
        # src-size 0 zero-fills; the source index is then 0, so no out-of-bounds address is formed (selecting the
        # index, not the pointer: one select, where choosing between two pointers reloads the tensor's address)
        index = self.expr(s.src.indices[0])
        src = f"(const void*)&{self.name(s.src.buffer)}[{pred} ? {index} : 0]"
        cache = "cg" if size == 16 else "ca"   # .cg (cache in L2 only) exists for 16-byte copies only
        self.lines += [f'{pad}asm volatile("cp.async.{cache}.shared.global [%0], [%1], {size}, %2;"',
                       f'{pad}    :: "r"({self.shared_address(s.dst)}), "l"({src}), "r"({pred} ? {size} : 0)',
                       f'{pad}    : "memory");']

    def warp_mask(self) -> str:
        # A partial last warp has fewer lanes; warp operations only run under warp-uniform control,
        # so the active mask is exactly the lanes that exist.
        return "0xffffffffu" if self.fn.num_threads % 32 == 0 else "__activemask()"

    # ------------------------------------------------------------------ expressions
    def non_negative(self, e: ir.Expr) -> bool:
        r = int_range(e, self.fn.block, self.ranges)
        return r is not None and r[0] >= 0

    def expr(self, e: ir.Expr) -> str:
        if isinstance(e, ir.Const):
            if e.dtype.is_bool:
                return "true" if e.value else "false"
            if e.dtype.is_float:
                text = _c_float(e.value, e.dtype if e.dtype.bits in (32, 64) else T.f32)
                return text if e.dtype.bits in (32, 64) else f"(({e.dtype.c_name})({text}))"
            suffix = {"long long": "LL", "unsigned long long": "ULL", "unsigned int": "u"}.get(e.dtype.c_name, "")
            if e.value == -(1 << (e.dtype.bits - 1)):    # a signed minimum's magnitude is no literal of its type
                return f"({e.value + 1}{suffix} - 1)"     # (-2147483648 is a long: max(int, long) is ambiguous)
            return f"{e.value}{suffix}" if e.value >= 0 or suffix else f"({e.value})"
        if isinstance(e, ir.Var):
            return self.name(e)
        if isinstance(e, ir.SpecialReg):
            return f"((int){e.name}.{e.axis})"
        if isinstance(e, ir.Binary):
            return self.binary(e)
        if isinstance(e, ir.Unary):
            return f"({'!' if e.op == 'not' else e.op}{self.expr(e.a)})"
        if isinstance(e, ir.Select):
            kept = ir.nan_to_zero_operand(e)
            if kept is not None:
                return f"td_nan_to_zero({self.expr(kept)})"
            a, b = (self.expr(x) if x.dtype == e.dtype else f"(({e.dtype.c_name})({self.expr(x)}))" for x in (e.a, e.b))
            if e.eager:
                return f"td_select<{e.dtype.c_name}>({self.expr(e.cond)}, {a}, {b})"
            return f"({self.expr(e.cond)} ? {a} : {b})"
        if isinstance(e, ir.Cast):
            if e.value.dtype.is_float and e.dtype.is_integer:
                return self.float_to_int(e)
            if e.value.dtype.bits == e.dtype.bits == 8 and e.dtype.is_float:    # no conversion between the formats:
                return f"(({e.dtype.c_name})((float)({self.expr(e.value)})))"   # through f32, which holds both
            if e.dtype.is_float and e.dtype.bits == 8 and e.value.dtype == T.f64:
                return f"td_fp8_of_f64<{e.dtype.c_name}>({self.expr(e.value)})"
            return f"(({e.dtype.c_name})({self.expr(e.value)}))"
        if isinstance(e, ir.Load):
            return f"{self.name(e.buffer)}[{self.expr(e.indices[0])}]"
        if isinstance(e, ir.Atomic):
            return self.atomic(e)
        if isinstance(e, ir.Call):
            return self.call(e)
        raise AssertionError(f"emit_cuda: unexpected expression {type(e).__name__}")

    def float_to_int(self, e: ir.Cast) -> str:
        """A float converted to an integer type through td_float_to_int (a 16-bit float through f32)."""
        wide = T.f64 if e.value.dtype.bits == 64 else T.f32
        value = self.expr(e.value)
        value = value if e.value.dtype == wide else f"(({wide.c_name})({value}))"
        low, high = e.dtype.limits
        bounds = [_c_float(float(low), wide), _c_float(float(high + 1), wide),
                  self.expr(ir.const(low, e.dtype)), self.expr(ir.const(high, e.dtype))]
        return f"td_float_to_int<{e.dtype.c_name}, {wide.c_name}>({value}, {', '.join(bounds)})"

    def binary(self, e: ir.Binary) -> str:
        a, b = self.expr(e.a), self.expr(e.b)
        if e.op in ("//", "%"):
            if e.dtype.is_float:
                helper = "td_pyfloordiv" if e.op == "//" else "td_pymod"
                return f"{helper}<{e.dtype.c_name}>({a}, {b})"
            shift = _power_of_two(e.b)
            if shift is not None and e.dtype.kind == "int":
                # floor semantics in two's complement, whatever a's sign: a // 2**k == a >> k, a % 2**k == a & (2**k - 1)
                # (a signed `/` by a power of two costs a sign correction; td_floordiv, a branch besides)
                return f"({a} >> {shift})" if e.op == "//" else f"({a} & {(1 << shift) - 1})"
            if e.dtype.kind == "uint" or (self.non_negative(e.a) and self.non_negative(e.b)):
                return f"({a} {'/' if e.op == '//' else '%'} {b})"
            helper = "td_floordiv" if e.op == "//" else "td_floormod"
            return f"{helper}<{e.dtype.c_name}>({a}, {b})"
        return f"({a} {_C_OPS.get(e.op, e.op)} {b})"

    def call(self, e: ir.Call) -> str:
        args = [self.expr(a) for a in e.args]
        if e.func in _SHUFFLES:
            value, lane, width = args
            if e.dtype.is_float and e.dtype.bits == 8:
                moved = f"{_SHUFFLES[e.func]}({self.warp_mask()}, (int)({value}).__x, {lane}, {width})"
                return f"td_fp8_of_bits<{e.dtype.c_name}>({moved})"
            return f"{_SHUFFLES[e.func]}({self.warp_mask()}, {value}, {lane}, {width})"
        if e.func == "sigmoid":
            one = "1.0f" if e.dtype.bits == 32 else "1.0"
            exp = "expf" if e.dtype.bits == 32 else "exp"
            return f"({one} / ({one} + {exp}(-({args[0]}))))"
        if e.dtype.is_float and e.func in ("max", "min"):
            return f"td_{e.func}<{e.dtype.c_name}>({', '.join(args)})"
        if e.dtype.is_float:
            name = _F32_MATH[e.func]
            return f"{name if e.dtype.bits == 32 else name[:-1]}({', '.join(args)})"
        if e.func == "abs":
            return f"{'llabs' if e.dtype.bits == 64 else 'abs'}({args[0]})"
        return f"{e.func}({', '.join(args)})"  # integer max / min

    def atomic(self, e: ir.Atomic) -> str:
        ptr = f"&{self.name(e.buffer)}[{self.expr(e.indices[0])}]"
        value = self.expr(e.value)
        if (e.op, e.dtype.name) in _NATIVE_ATOMICS:
            return f"atomic{e.op.capitalize()}({ptr}, {value})"
        c = e.dtype.c_name
        return f"td_atomic_rmw({ptr}, {value}, []({c} a, {c} b) {{ return {_RMW_OPS[e.op]}; }})"
