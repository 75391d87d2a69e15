"""The inline PTX of generated CUDA C++ on the host: mma.sync, ldmatrix, cp.async, prefetch for tests/cuda_on_host.py.

`translate(source)` replaces each `asm volatile(...)` statement the CUDA generator writes by a call of its host
emulation (`RUNTIME`, compiled into cuda_on_host's runtime), operand by operand as the instruction's template
names them, so a wrong operand order in the generator is run as written, not as meant:

- `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}` and `m16n8k32.row.col.f32.{e4m3,e5m2}` (the two mixed
  too) or `.s32.{s8,u8}`: the warp's 32 lanes hand in their fragments (a warp exchange: every lane must be
  there); A (16xK) and B (Kx8) are rebuilt by the PTX ISA's fragment layouts and A B summed in double (exact:
  the products of these types and their sums over K; a bf16 product past f32's range stays finite here, where the
  cpu target's f32 gives inf), by the first lane there for the warp, and each lane adds
  its C to its four elements of D, rounded once to f32 (wrapped to s32);
- `ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16`: lanes 8j..8j+7 hand in the row addresses of
  matrix j; each lane gathers its elements (of the transpose with .trans);
- `cp.async.{ca,cg}.shared.global` with `commit_group` and `wait_group N`: each thread queues its copies, and a
  copy reads its source and writes its destination (zero-filled past src-size) only when a `wait_group` retires
  its group: the latest a GPU may do it, so a read of the destination before its wait sees stale bytes;
- `prefetch.global.L2`: nothing (a hint), its address formed.

The shared addresses of ldmatrix and cp.async must lie, whole and aligned as the PTX ISA requires, inside one
shared array the block declared (cuda_on_host poisons those: a read before the copy lands sees NaN or -1); a
violation stops the launch with an error. Any other inline PTX is refused (`Unsupported`).
"""
from __future__ import annotations

import functools
import re

SHIM = r"""// inline PTX on the host (tests/ptx_on_host.py)
extern "C" void td_host_mma(int k, int a_type, int b_type, const unsigned* a, const unsigned* b, const void* c,
                            void* d);
extern "C" void td_host_ldmatrix(int num, int trans, const void* address, unsigned* out);
extern "C" void td_host_cp_async(void* dst, const void* src, int size, int src_size, int cache_global);
extern "C" void td_host_cp_async_commit();
extern "C" void td_host_cp_async_wait(int pending);
"""

# Appended to cuda_on_host's RUNTIME: it uses that file's `current`, `me()`, `shared_arrays` and `warp_exchange`.
RUNTIME = r"""
// ------------------------------------------------------------ inline PTX (tests/ptx_on_host.py)
namespace {
void check_shared(const void* address, int bytes, const char* what) {
  auto p = (const unsigned char*)address;
  for (const SharedArray& a : shared_arrays)
    if (p >= a.begin && p + bytes <= a.begin + a.bytes) return;
  throw std::runtime_error(std::string(what) + ": " + std::to_string(bytes) +
                           " bytes at a shared address outside every shared array of the block");
}

void check_aligned(const void* address, int bytes, const char* what) {
  if ((unsigned long long)address % bytes != 0)
    throw std::runtime_error(std::string(what) + ": an address not aligned to " + std::to_string(bytes) + " bytes");
}

// An operand element of PTX type `type` (OPERAND_TYPES' index) with bits `bits`, as a double (exactly).
double operand_value(unsigned bits, int type) {
  switch (type) {
    case 0: return (double)__builtin_bit_cast(_Float16, (unsigned short)bits);
    case 1: return __builtin_bit_cast(float, bits << 16);
    case 2: return td_host_fp8_value(bits, 3, 7, 448);
    case 3: return td_host_fp8_value(bits, 2, 15, 57344);
    case 4: return (signed char)bits;
    default: return (unsigned char)bits;
  }
}

struct Copy { unsigned char* dst; const unsigned char* src; int size, src_size; };
struct Copies {                          // a thread's cp.async state
  std::vector<Copy> uncommitted;
  std::deque<std::vector<Copy>> committed;
};
std::vector<Copies> copies;             // per thread of the block

struct Product {                         // a warp's mma: A B, for the exchange that gave A and B
  int exchange = -1;
  double ab[16][8];
};
std::vector<Product> products;          // per warp of the block
}  // namespace

void begin_ptx_block(int threads) {      // cuda_on_host's td_host_run, before each block
  copies.assign(threads, Copies());
  products.assign((threads + 31) / 32, Product());
}

// mma.sync.aligned.m16n8k{k}.row.col: D = A B + C over the warp, for operands of `per` = k / 8 elements a 32-bit
// register (16 or 8 bits, the first in the low bits). groupID = lane >> 2 and threadID_in_group = lane % 4;
// element e of a lane's A register q is A[groupID + 8 * (q % 2), per * tig + e + k / 2 * (q / 2)], of its B
// register q B[per * tig + e + k / 2 * q, groupID]; its C and D element r is [groupID + 8 * (r / 2), 2 * tig + r % 2].
// Integer operands (s8, u8) accumulate in s32 (wrapping), the others in f32.
extern "C" void td_host_mma(int k, int a_type, int b_type, const unsigned* a, const unsigned* b, const void* c,
                            void* d) {
  struct Fragments { unsigned a[4], b[2]; } mine, all[32];
  std::memcpy(mine.a, a, sizeof mine.a);
  std::memcpy(mine.b, b, sizeof mine.b);
  warp_exchange(64 + 8 * a_type + b_type, "mma.sync", &mine, sizeof mine, all);
  Product& p = products[me().warp];
  int per = k / 8, bits = 32 / per;
  if (p.exchange != me().exchanges) {     // the warp's first lane here computes A B for all (fibers take turns)
    p.exchange = me().exchanges;
    double A[16][32], B[32][8];
    auto element = [&](unsigned word, int e) { return word >> (bits * e) & ((1u << bits) - 1); };
    for (int lane = 0; lane < 32; ++lane) {
      int group = lane >> 2, tig = lane % 4;
      for (int e = 0; e < per; ++e) {
        for (int q = 0; q < 4; ++q)
          A[group + 8 * (q % 2)][per * tig + e + k / 2 * (q / 2)] = operand_value(element(all[lane].a[q], e), a_type);
        for (int q = 0; q < 2; ++q)
          B[per * tig + e + k / 2 * q][group] = operand_value(element(all[lane].b[q], e), b_type);
      }
    }
    for (int row = 0; row < 16; ++row)
      for (int col = 0; col < 8; ++col) {
        double sum = 0;
        for (int kk = 0; kk < k; ++kk) sum += A[row][kk] * B[kk][col];    // exact for these operand types
        p.ab[row][col] = sum;
      }
  }
  int group = me().lane >> 2, tig = me().lane % 4;
  for (int r = 0; r < 4; ++r) {
    double ab = p.ab[group + 8 * (r / 2)][2 * tig + r % 2];
    if (a_type >= 4)       // s32: wraps, as the GPU's does without .satfinite
      ((int*)d)[r] = (int)(unsigned)((long long)((const int*)c)[r] + (long long)ab);
    else
      ((float*)d)[r] = (float)(((const float*)c)[r] + ab);
  }
}

// ldmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16: lanes 8j..8j+7 give the (16-byte aligned) row addresses
// of matrix j; register j of lane l holds elements (l / 4, 2 * (l % 4) + i) of matrix j, of its transpose with
// .trans, the first in the low half.
extern "C" void td_host_ldmatrix(int num, int trans, const void* address, unsigned* out) {
  const void* rows[32];
  warp_exchange(3 + 2 * num + trans, "ldmatrix", &address, sizeof address, rows);
  for (int k = 0; k < 8 * num; ++k) {
    check_aligned(rows[k], 16, "ldmatrix");
    check_shared(rows[k], 16, "ldmatrix");
  }
  for (int j = 0; j < num; ++j) {
    unsigned word = 0;
    for (int i = 0; i < 2; ++i) {
      int row = me().lane / 4, col = 2 * (me().lane % 4) + i;
      if (trans) std::swap(row, col);
      unsigned short element;
      std::memcpy(&element, (const unsigned char*)rows[8 * j + row] + 2 * col, 2);
      word |= (unsigned)element << (16 * i);
    }
    out[j] = word;
  }
}

// cp.async.{ca,cg}.shared.global [dst], [src], size, src_size: queued until a wait_group retires its group.
extern "C" void td_host_cp_async(void* dst, const void* src, int size, int src_size, int cache_global) {
  if (size != 4 && size != 8 && size != 16) throw std::runtime_error("cp.async copies 4, 8 or 16 bytes");
  if (cache_global && size != 16) throw std::runtime_error("cp.async.cg copies 16 bytes");
  if (src_size < 0 || src_size > size)
    throw std::runtime_error("cp.async: src-size " + std::to_string(src_size) + " outside 0.." + std::to_string(size));
  check_aligned(dst, size, "cp.async (shared)");
  check_aligned(src, size, "cp.async (global)");
  check_shared(dst, size, "cp.async");
  copies[current->running].uncommitted.push_back({(unsigned char*)dst, (const unsigned char*)src, size, src_size});
}

extern "C" void td_host_cp_async_commit() {      // an empty group is a group too
  Copies& mine = copies[current->running];
  mine.committed.push_back(std::move(mine.uncommitted));
  mine.uncommitted.clear();
}

extern "C" void td_host_cp_async_wait(int pending) {
  Copies& mine = copies[current->running];
  while ((int)mine.committed.size() > pending) {
    for (const Copy& c : mine.committed.front()) {
      std::memcpy(c.dst, c.src, c.src_size);
      std::memset(c.dst + c.src_size, 0, c.size - c.src_size);
    }
    mine.committed.pop_front();
  }
}
"""


class Unsupported(Exception):
    """Inline PTX that `translate` has no host emulation for."""


_ASM = re.compile(r"\basm\s+volatile\s*\(")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_OPERAND = re.compile(r'\s*"([^"]*)"\s*\((.*)\)\s*', re.S)
_SHARED_ADDRESS = re.compile(r"\(unsigned\)__cvta_generic_to_shared\((.*)\)", re.S)
_GLOBAL_ADDRESS = re.compile(r"__cvta_generic_to_global\((.*)\)", re.S)
_MMA = re.compile(r"mma\.sync\.aligned\.m16n8k(16|32)\.row\.col\.(f32|s32)\.(\w+)\.(\w+)\.\2")
OPERAND_TYPES = ("f16", "bf16", "e4m3", "e5m2", "s8", "u8")      # operand_value's codes
# the operand pairs of each mma shape, and their accumulator's type
MMA_KINDS = {("16", "f32"): (("f16", "f16"), ("bf16", "bf16")),
             ("32", "f32"): tuple((a, b) for a in ("e4m3", "e5m2") for b in ("e4m3", "e5m2")),
             ("32", "s32"): tuple((a, b) for a in ("s8", "u8") for b in ("s8", "u8"))}
_LDMATRIX = re.compile(r"ldmatrix\.sync\.aligned\.m8n8\.x([124])(\.trans)?\.shared\.b16")
_CP_ASYNC = re.compile(r"cp\.async\.(ca|cg)\.shared\.global")
_WAIT = re.compile(r"cp\.async\.wait_group")
_OPEN, _CLOSE = "([{", ")]}"


@functools.lru_cache(maxsize=64)     # a host run asks more than once: whether it can run, then to build
def translate(source: str) -> str:
    """CUDA `source` with each `asm volatile(...);` statement replaced by a block calling its host emulation."""
    pieces, pos = [], 0
    for match in _ASM.finditer(source):
        if match.start() < pos:
            continue
        close = _closing(source, match.end() - 1)
        after = source[close + 1:]
        semicolon = close + 1 + len(after) - len(after.lstrip())
        if source[semicolon:semicolon + 1] != ";":
            raise Unsupported(f"an asm statement not followed by ';': {source[match.start():close + 1]!r}")
        pieces += [source[pos:match.start()], _emulation(source[match.end():close])]
        pos = semicolon + 1
    return "".join(pieces) + source[pos:]


def _scan(text: str, start: int = 0):
    """(index, bracket depth after it) of each character of `text` from `start`, string literals skipped."""
    depth, k = 0, start
    while k < len(text):
        if text[k] == '"':
            k = _STRING.match(text, k).end()
            continue
        depth += (text[k] in _OPEN) - (text[k] in _CLOSE)
        yield k, depth
        k += 1


def _closing(text: str, open_at: int) -> int:
    """The index of the bracket that closes the one at `open_at`."""
    for k, depth in _scan(text, open_at):
        if depth == 0:
            return k
    raise Unsupported("an asm statement whose brackets do not close")


def _split(text: str, separator: str) -> list[str]:
    """`text` split at each `separator` outside brackets and string literals."""
    parts, start = [], 0
    for k, depth in _scan(text):
        if text[k] == separator and depth == 0:
            parts.append(text[start:k])
            start = k + 1
    return parts + [text[start:]]


def _emulation(body: str) -> str:
    """The host block for the inside of `asm volatile(...)`: its template, outputs, inputs and clobbers."""
    sections = _split(body, ":")
    template = "".join(_STRING.findall(sections[0])).strip().rstrip(";").strip()
    operands = [_operand(text) for section in sections[1:3] for text in _split(section, ",") if text.strip()]
    mnemonic, _, rest = template.partition(" ")
    args = [_argument(text.strip(), operands) for text in _split(rest, ",") if text.strip()]
    if (match := _MMA.fullmatch(mnemonic)) and match.group(3, 4) in MMA_KINDS.get(match.group(1, 2), ()):
        d, a, b, c = args
        acc, kind = ("float", "f") if match[2] == "f32" else ("int", "r")
        return (f"{{ const unsigned td_host_a[4] = {{{', '.join(_values(a, 'r'))}}}; "
                f"const unsigned td_host_b[2] = {{{', '.join(_values(b, 'r'))}}}; "
                f"const {acc} td_host_c[4] = {{{', '.join(_values(c, kind))}}}; {acc} td_host_d[4]; "
                f"td_host_mma({match[1]}, {OPERAND_TYPES.index(match[3])}, {OPERAND_TYPES.index(match[4])}, "
                f"td_host_a, td_host_b, td_host_c, td_host_d); " + _assign(d, "td_host_d", kind) + " }")
    if match := _LDMATRIX.fullmatch(mnemonic):
        num = int(match[1])
        outputs, (_, address) = args
        return (f"{{ unsigned td_host_r[{num}]; td_host_ldmatrix({num}, {int(bool(match[2]))}, "
                f"{_shared_pointer(address)}, td_host_r); " + _assign(outputs, "td_host_r", "r") + " }")
    if match := _CP_ASYNC.fullmatch(mnemonic):
        (_, dst), (_, src), (size, literal), src_size = args
        if literal is not None:
            raise Unsupported(f"cp.async with a copy size from a register: '{template}'")
        return (f"{{ td_host_cp_async({_shared_pointer(dst)}, {_value(src, 'l')}, {size}, {_value(src_size, 'r')}, "
                f"{int(match[1] == 'cg')}); }}")
    if mnemonic == "prefetch.global.L2" and len(args) == 1 and args[0][0] == "[":
        return f"{{ (void){_global_pointer(args[0][1])}; }}"     # a hint: the address is formed, nothing read
    if mnemonic == "cp.async.commit_group" and not args:
        return "{ td_host_cp_async_commit(); }"
    if _WAIT.fullmatch(mnemonic) and len(args) == 1 and args[0][1] is None:
        return f"{{ td_host_cp_async_wait({args[0][0]}); }}"
    raise Unsupported(f"inline PTX '{template}'")


def _operand(text: str) -> tuple[str, str]:
    """(constraint, C expression) of an asm operand `"constraint"(expression)`."""
    match = _OPERAND.fullmatch(text)
    if match is None:
        raise Unsupported(f"an asm operand {text.strip()!r}")
    return match[1], match[2].strip()


def _argument(text: str, operands: list):
    """A template argument: a list of operands for `{%a, %b}`, ('[', operand) for `[%n]`, an operand for
    `%n`, (literal, None) for a number."""
    if text.startswith("{") and text.endswith("}"):
        return [_argument(t.strip(), operands) for t in text[1:-1].split(",")]
    if text.startswith("[") and text.endswith("]"):
        return "[", _argument(text[1:-1].strip(), operands)
    if re.fullmatch(r"%\d+", text):
        return operands[int(text[1:])]
    if re.fullmatch(r"\d+", text):
        return text, None
    raise Unsupported(f"a PTX operand {text!r}")


def _value(operand: tuple, kind: str) -> str:
    """The C expression an input operand of register kind `kind` (r, f, l) reads."""
    constraint, expression = operand
    if constraint.lstrip("+") != kind or constraint.startswith("="):
        raise Unsupported(f'an operand "{constraint}" where PTX reads a "{kind}" register')
    return f"({expression})"


def _values(operands: list, kind: str) -> list[str]:
    return [_value(o, kind) for o in operands]


def _assign(operands: list, array: str, kind: str) -> str:
    """Statements storing `array`'s elements into the output operands."""
    for constraint, _ in operands:
        if constraint not in (f"={kind}", f"+{kind}"):
            raise Unsupported(f'an operand "{constraint}" where PTX writes a "{kind}" register')
    return " ".join(f"{expression} = {array}[{k}];" for k, (_, expression) in enumerate(operands))


def _global_pointer(operand: tuple) -> str:
    """A host pointer for a global-space address operand ("l", from __cvta_generic_to_global)."""
    match = _GLOBAL_ADDRESS.fullmatch(_value(operand, "l")[1:-1])
    if match is None:
        raise Unsupported(f"a global address not taken by __cvta_generic_to_global: {operand[1]!r}")
    return f"((const void*)({match[1]}))"


def _shared_pointer(operand: tuple) -> str:
    """A host pointer for a shared-space address operand ("r", from __cvta_generic_to_shared)."""
    match = _SHARED_ADDRESS.fullmatch(_value(operand, "r")[1:-1])
    if match is None:
        raise Unsupported(f"a shared address not taken by __cvta_generic_to_shared: {operand[1]!r}")
    return f"(void*)({match[1]})"
