"""Scalar data types and tensor annotations (`f32["M", "K"]`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DataType:
    """A scalar type: its DSL name, kind ('float', 'int', 'uint', 'bool') and width."""

    name: str
    kind: str
    bits: int
    c_name: str

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def computes_in_f32(self) -> bool:
        """Whether this is a storage format whose arithmetic is done in f32 (f16, bf16, the 8-bit floats)."""
        return self.kind == "float" and self.bits < 32

    @property
    def is_integer(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def limits(self) -> tuple[int, int]:
        """The least and the greatest value of this integer type."""
        if self.kind == "int":
            return -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1
        return 0, (1 << self.bits) - 1

    @property
    def lowest(self) -> float | int:
        """The least value of this type (-inf for floats): no value lies below it (a maximum's start)."""
        return -math.inf if self.is_float else self.limits[0]

    def holds(self, value: int) -> bool:
        """Whether the integer `value` is representable in this integer type."""
        low, high = self.limits
        return low <= value <= high

    def saturate(self, value: float) -> int:
        """A float converted to this integer type as taskdsl converts one on both targets: truncated toward zero,
        clamped to the type's range, NaN giving 0 (PTX's cvt.rzi; C leaves a value that does not fit undefined)."""
        if value != value:
            return 0
        low, high = self.limits
        return low if value < low else high if value > high else int(value)

    def wrap(self, value: int) -> int:
        """`value` converted to this integer type as C converts it (modulo 2**bits)."""
        value &= (1 << self.bits) - 1
        return value - (1 << self.bits) if self.kind == "int" and value >> (self.bits - 1) else value

    def round(self, value: float) -> float:
        """`value` rounded to the nearest value of this float type (ties to even; overflow gives inf)."""
        if self.bits == 64:
            return float(value)
        if self.bits == 32:
            with np.errstate(over="ignore"):
                return float(np.float32(value))
        bits = self.narrow_bits(value)
        if self.bits == 8:
            return float(FLOAT8_VALUES[self.name][bits])
        if self.name == "f16":
            return float(np.array(bits, np.uint16).view(np.float16))
        return float(np.array(bits << 16, np.uint32).view(np.float32))

    def narrow_bits(self, value: float) -> int:
        """The bits of `value` rounded to this 16- or 8-bit float type (ties to even, in one rounding; the 8-bit
        types saturate)."""
        if self.bits == 8:
            return int(float8_bits(float(value), *FLOAT8_FORMATS[self.name]))
        return int(narrow_float_bits(float(value), *_NARROW_FORMATS[self.name]))

    def overflows(self, value) -> bool:
        """Whether the finite `value` is past the range of this float type: an IEEE type would round it to inf, an
        8-bit one (which saturates) to a value other than the nearest."""
        if not abs(value) < math.inf:
            return False
        threshold, tie_rounds_past = self.overflow_threshold
        return abs(value) > threshold or (tie_rounds_past and abs(value) == threshold)

    @property
    def overflow_threshold(self) -> tuple:
        """(t, whether t itself rounds past): magnitudes beyond t round past this float type's largest finite value
        (to inf, or for the 8-bit types, which saturate, the pattern past it). t is halfway above the largest; a tie
        rounds to even, past the largest where its pattern is odd (IEEE types, E5M2's 0x7B), not E4M3's 0x7E."""
        if self.bits == 8:
            mant_bits, _, largest = FLOAT8_FORMATS[self.name]
            half_unit = math.ldexp(1.0, math.frexp(largest)[1] - 2 - mant_bits)   # half the last place's unit there
            return largest + half_unit, self.narrow_bits(largest) & 1 == 1
        mant_bits, bias = _FLOAT_FORMATS[self.name][:2]
        return (1 << (bias + 1)) - (1 << (bias - mant_bits - 1)), True

    def float_text(self, value: float) -> str:
        """The shortest decimal text that reads back exactly as `value`, a value of this float type,
        in f32 (which holds every 16- and 32-bit float) or f64."""
        return repr(float(value)) if self.bits == 64 else str(np.float32(value))

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype holding this type (bf16 and the 8-bit floats are stored as their raw bits)."""
        return np.dtype(_NUMPY_NAMES[self.name])

    def __getitem__(self, dims) -> "TensorSpec":
        """`f32["M", 64]`: a tensor parameter annotation (dims are ints or size-symbol names)."""
        dims = tuple(int(d) if isinstance(d, np.integer) else d for d in (dims if isinstance(dims, tuple) else (dims,)))
        for d in dims:
            if isinstance(d, bool) or not isinstance(d, (int, str)) or (isinstance(d, int) and d < 0):
                raise TypeError(f"tensor dims must be non-negative ints or size-symbol names, got {d!r}")
            if isinstance(d, str) and not d.isidentifier():     # "N*2" would be a symbol of its own, unrelated to N
                raise TypeError(f"tensor dim {d!r} is not a size-symbol name (an identifier such as 'N'); a size "
                                "computed from others is not supported in annotations: check it in the kernel")
        return TensorSpec(self, tuple(dims))

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class TensorSpec:
    """The annotation of a tensor parameter: dtype and dims (ints or symbol names)."""

    dtype: DataType
    dims: tuple

    def __repr__(self) -> str:
        return f"{self.dtype.name}[{', '.join(repr(d) for d in self.dims)}]"

    def __getitem__(self, dims):
        """A C-style f32[4][4]: a TypeError saying how to write it."""
        more = dims if isinstance(dims, tuple) else (dims,)
        raise TypeError(f"{self!r}{list(more)!r} is C's form: write {self.dtype.name}"
                        f"[{', '.join(repr(d) for d in self.dims + more)}] for a tensor of those dims")


f16 = DataType("f16", "float", 16, "__half")
bf16 = DataType("bf16", "float", 16, "__nv_bfloat16")
f32 = DataType("f32", "float", 32, "float")
f64 = DataType("f64", "float", 64, "double")
i8 = DataType("i8", "int", 8, "signed char")
i16 = DataType("i16", "int", 16, "short")
i32 = DataType("i32", "int", 32, "int")
i64 = DataType("i64", "int", 64, "long long")
u8 = DataType("u8", "uint", 8, "unsigned char")
u16 = DataType("u16", "uint", 16, "unsigned short")
u32 = DataType("u32", "uint", 32, "unsigned int")
u64 = DataType("u64", "uint", 64, "unsigned long long")
boolean = DataType("bool", "bool", 8, "bool")
# OCP's 8-bit floats (ml_dtypes' float8_e4m3fn and float8_e5m2, ONNX's FLOAT8E4M3FN and FLOAT8E5M2): E4M3 has no inf
# (its largest is 448, S.1111.111 its NaN), E5M2 is IEEE-like (largest 57344)
f8e4m3 = DataType("f8e4m3", "float", 8, "__nv_fp8_e4m3")
f8e5m2 = DataType("f8e5m2", "float", 8, "__nv_fp8_e5m2")

_NARROW_FORMATS = {"f16": (10, 15, 31), "bf16": (7, 127, 255)}    # mantissa bits, exponent bias, all-ones exponent
_FLOAT_FORMATS = {**_NARROW_FORMATS, "f32": (23, 127, 255), "f64": (52, 1023, 2047)}
_NUMPY_NAMES = {"f16": "float16", "bf16": "uint16", "f8e4m3": "uint8", "f8e5m2": "uint8", "f32": "float32",
                "f64": "float64", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "u8": "uint8",
                "u16": "uint16", "u32": "uint32", "u64": "uint64", "bool": "bool"}
ALL_DTYPES = (f16, bf16, f8e4m3, f8e5m2, f32, f64, i8, i16, i32, i64, u8, u16, u32, u64, boolean)
# the types numpy holds as ml_dtypes' types, and their names there (the kernels get their bits)
ML_DTYPES_NAMES = {"bf16": "bfloat16", "f8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2"}
_BY_ML_DTYPES_NAME = {ML_DTYPES_NAMES[t.name]: t for t in ALL_DTYPES if t.name in ML_DTYPES_NAMES}


def is_float_dtype(dtype: np.dtype) -> bool:
    """Whether a numpy dtype is a float type (ml_dtypes' bfloat16 and 8-bit floats included: numpy's kind of
    float8_e5m2 is 'f', of the others 'V')."""
    return dtype.kind == "f" or (dtype.kind == "V" and dtype.name in _BY_ML_DTYPES_NAME)     # (.name costs a us)


def is_number_dtype(dtype: np.dtype) -> bool:
    """Whether a numpy dtype holds numbers (bool, int, float): not objects, strings or records."""
    return dtype.kind in "biu" or is_float_dtype(dtype)


def numpy_dtype(dtype: DataType) -> np.dtype:
    """The numpy dtype of a type's values (bf16 as ml_dtypes' bfloat16, not the uint16 of its bits; the 8-bit floats
    as ml_dtypes' float8 types)."""
    if dtype.name in ML_DTYPES_NAMES:
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, ML_DTYPES_NAMES[dtype.name]))
    return dtype.numpy


# Names of types as C, ONNX and numpy spell them: "float" is C's and ONNX's 32-bit float (numpy's np.dtype("float")
# is 64-bit, but a kernel language reads it as C does), "half" and "double" as in C.
_TYPE_NAMES = {"float16": f16, "half": f16, "bfloat16": bf16, "float32": f32, "float": f32, "float64": f64,
               "double": f64, "int8": i8, "int16": i16, "int32": i32, "int64": i64, "uint8": u8, "uint16": u16,
               "uint32": u32, "uint64": u64, "bool": boolean,
               "float8_e4m3fn": f8e4m3, "float8_e5m2": f8e5m2}


def as_dtype(dtype, what: str = "dtype") -> DataType:
    """A DataType from a DataType, its name ('f32'), a C/numpy name ('float32', 'float', 'half') or a numpy dtype;
    TypeError naming `what` otherwise."""
    if isinstance(dtype, DataType):
        return dtype
    if dtype is None:       # numpy reads None as float64
        raise TypeError(f"{what}: no type given (None); use a taskdsl type (td.f32, ...), a name or a numpy dtype")
    if isinstance(dtype, str):
        by_name = {t.name: t for t in ALL_DTYPES} | _TYPE_NAMES
        if dtype in by_name:
            return by_name[dtype]
        raise TypeError(f"{what}: unknown type name {dtype!r}; use a taskdsl type (td.f32, ...), one of "
                        f"{', '.join(by_name)}, or a numpy dtype")
    try:
        return from_numpy(dtype)
    except TypeError as e:
        raise TypeError(f"{what}: {e}") from None


_FROM_NUMPY: dict = {}      # what from_numpy was given (a dtype, a scalar type, a name) -> its DataType


def from_numpy(dtype) -> DataType:
    """The DataType of a numpy dtype (ml_dtypes' bfloat16 is bf16, its float8_e4m3fn f8e4m3; uint16 is u16, not
    bf16's bits); TypeError for dtypes the DSL has no type for."""
    try:        # every operator call asks, for each operand: numpy's dtype.name alone costs a microsecond
        found = _FROM_NUMPY.get(dtype)
    except TypeError:       # unhashable (a list of fields, say)
        return _from_numpy(dtype)
    if found is None:
        found = _from_numpy(dtype)
        if len(_FROM_NUMPY) < 256:
            _FROM_NUMPY[dtype] = found
    return found


def _from_numpy(dtype) -> DataType:
    dtype = np.dtype(dtype)
    if not dtype.isnative:      # big-endian data: its type is the native one (arrays are converted on the way in)
        dtype = dtype.newbyteorder("=")
    if dtype.name in _BY_ML_DTYPES_NAME:
        return _BY_ML_DTYPES_NAME[dtype.name]
    for t in ALL_DTYPES:
        if t.name not in ML_DTYPES_NAMES and t.numpy == dtype:
            return t
    raise TypeError(f"numpy dtype {dtype} has no taskdsl type; use one of "
                    f"{', '.join(str(t.numpy) for t in ALL_DTYPES if t.name not in ML_DTYPES_NAMES)} or ml_dtypes' "
                    f"{', '.join(ML_DTYPES_NAMES.values())}")


def promote(a: DataType, b: DataType) -> DataType:
    """The type arithmetic on two operands is computed in (C rules: float beats int, wider wins,
    integers narrower than 32 bits and bools widen to i32, two different storage formats (f16 with bf16, say)
    give f32)."""
    if a.is_float or b.is_float:
        if a.is_float and b.is_float and a != b:
            return f32 if a.computes_in_f32 and b.computes_in_f32 else max(a, b, key=lambda t: t.bits)
        return a if a.is_float else b
    if a.bits < 32 and b.bits < 32:
        return i32
    widest = max((a, b), key=lambda t: (t.bits, t.kind == "uint"))
    return widest if widest.bits >= 32 else i32


def narrow_float_bits(x, mant_bits, exp_bias, exp_max):
    """IEEE round-to-nearest-even of float `x` to a narrower format's sign|exponent|mantissa bits.

    Plain Python that numba compiles too (the cpu target's f16/bf16 stores use it).
    """
    if x != x:      # a quiet NaN of x's sign, as numpy's and ml_dtypes' conversions give
        return (0x8000 if math.copysign(1.0, x) < 0.0 else 0) | (exp_max << mant_bits) | (1 << (mant_bits - 1))
    sign = 0x8000 if x < 0.0 or (x == 0.0 and math.copysign(1.0, x) < 0.0) else 0
    a = abs(np.float64(x))
    if a == math.inf:
        return sign | (exp_max << mant_bits)
    if a == 0.0:
        return sign
    m, e = math.frexp(a)              # a = m * 2**e, 0.5 <= m < 1
    biased = e - 1 + exp_bias
    if biased <= 0:                   # subnormal: units of 2**(1 - bias - mant_bits)
        return sign | np.int64(np.rint(math.ldexp(a, exp_bias - 1 + mant_bits)))
    frac = np.int64(np.rint((2.0 * m - 1.0) * (1 << mant_bits)))
    if frac == (1 << mant_bits):
        frac = 0
        biased += 1
    if biased >= exp_max:
        return sign | (exp_max << mant_bits)
    return sign | (biased << mant_bits) | frac


# mantissa bits, exponent bias, largest finite value
FLOAT8_FORMATS = {"f8e4m3": (3, 7, 448.0), "f8e5m2": (2, 15, 57344.0)}
FLOAT8_NAN = 0x7F      # both formats' NaN from a conversion (E4M3's only positive one; E5M2's with mantissa 11)


def float8_bits(x, mant_bits, exp_bias, largest):
    """The bits of float `x` rounded to an 8-bit float as CUDA's conversions of an f32 with __NV_SATFINITE round
    it: to nearest even, once; a magnitude past the largest finite value (inf included) gives the largest, a NaN
    0x7F (CUDA's canonical NaN: the conversion from an f32 drops the sign and the payload).

    Plain Python that numba compiles too (the cpu target's 8-bit float stores use it).
    """
    if x != x:
        return FLOAT8_NAN
    sign = 0x80 if x < 0.0 or (x == 0.0 and math.copysign(1.0, x) < 0.0) else 0
    a = min(abs(np.float64(x)), largest)      # saturated: a value below the largest never rounds past it
    if a == 0.0:
        return sign
    e = math.frexp(a)[1] - 1                  # 2**e <= a < 2**(e + 1)
    unit = max(e, 1 - exp_bias) - mant_bits   # the exponent of a's last place (the subnormals' below the normals)
    units = np.int64(np.rint(math.ldexp(a, -unit)))     # exact scaling, rounded to even
    if units < (1 << mant_bits):              # a subnormal (or the least normal, reached by rounding up)
        return sign | units
    if units == (2 << mant_bits):             # rounded up into the next binade
        units, unit = units >> 1, unit + 1
    return sign | ((unit + mant_bits + exp_bias) << mant_bits) | (units - (1 << mant_bits))


def _float8_values(mant_bits, exp_bias, largest) -> np.ndarray:
    """The f32 value of each of the 256 bit patterns of an 8-bit float format."""
    values = np.empty(256, np.float32)
    for bits in range(256):
        exp, mant = (bits & 0x7F) >> mant_bits, bits & ((1 << mant_bits) - 1)
        if exp == 0:
            magnitude = math.ldexp(mant, 1 - exp_bias - mant_bits)
        else:
            magnitude = math.ldexp((1 << mant_bits) | mant, exp - exp_bias - mant_bits)
        if magnitude > largest:       # E5M2's all-ones exponent (inf, NaNs), E4M3's S.1111.111 (NaN)
            magnitude = math.inf if mant == 0 else math.nan
        values[bits] = -magnitude if bits & 0x80 else magnitude
    return values


FLOAT8_VALUES = {name: _float8_values(*fmt) for name, fmt in FLOAT8_FORMATS.items()}
