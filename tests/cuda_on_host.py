"""Run a kernel's generated CUDA C++ on the host CPU: the CUDA generator's semantics, checked without a GPU.

`run_on_host(kernel, *args)` takes a kernel call's arguments and, like a cpu call, writes the results into
the numpy arrays. The CUDA source (`kernel.source(..., target="cuda")`) is compiled by the host's C++
compiler with a shim header (`KERNEL_SHIM`) that gives the CUDA names it uses a host meaning, into a shared
library linked against a small runtime (`RUNTIME`, compiled once) that runs the launch:

- every thread of a block is a fiber (ucontext, its own stack) that runs until it waits at a barrier or
  returns, the block's fibers in turns, ascending and descending thread order by turns (a schedule CUDA allows;
  a switch costs far less than waking an OS thread); the blocks run one after another, so `__shared__` arrays
  are function-level statics, poisoned (every byte 0xff) when a block first declares them;
- `__syncthreads()` and `__syncwarp()` are barriers over the block's (the warp's) threads; a thread that
  returns drops out of them, as CUDA counts an exited thread as arrived;
- a shuffle is a per-warp exchange between two warp barriers, reading the source lane as PTX's
  `shfl.sync` does with the segment mask and clamp CUDA's `__shfl_*_sync(mask, v, arg, width)` pass;
- a block whose live threads all wait at barriers no other thread will reach is a deadlock: the launch
  stops and raises, where a GPU would hang;
- atomics are plain read-modify-writes, atomic since threads switch only at barriers.

The kernel's translation unit includes no header (the shim declares the math through GCC builtins), so a
kernel compiles in about a tenth of a second; libraries are cached by a hash of their text. The inline PTX the
generator writes (mma.sync, ldmatrix, cp.async, prefetch) runs through its host emulation in `ptx_on_host.py`; other
inline PTX is refused with `UnsupportedSource`.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from taskdsl.backend.cuda.launch import kernel_params

from . import ptx_on_host

# -O0: the kernels are small and run briefly; optimizing costs more compile time than it saves. -fwrapv: signed
# overflow wraps, as it does on a GPU. -fnon-call-exceptions: an integer division by zero (x86 traps; a GPU gives
# an unspecified value) throws out of the SIGFPE handler and stops the launch with an error.
FLAGS = ("-std=c++17", "-O0", "-fPIC", "-fwrapv", "-fnon-call-exceptions", "-w")

FP8_VALUE = r"""// an 8-bit float's bits (format: mantissa bits, bias, largest finite value) as a float; the
// kernels' shim and the runtime's mma.sync both read them
inline float td_host_fp8_value(unsigned char bits, int mant, int bias, double largest) {
  int exp = (bits & 0x7f) >> mant, m = bits & ((1 << mant) - 1);
  double magnitude = exp == 0 ? __builtin_ldexp(m, 1 - bias - mant)
                              : __builtin_ldexp((1 << mant) | m, exp - bias - mant);
  if (magnitude > largest) magnitude = m == 0 ? __builtin_inf() : __builtin_nan("");     // E5M2's inf, NaNs
  return (float)(bits & 0x80 ? -magnitude : magnitude); }
"""

HOST_DYNAMIC_SMEM_BYTES = 256 * 1024     # the runtime's buffer of dynamic shared memory (TD_HOST_DYNAMIC_SMEM_BYTES)

KERNEL_SHIM = r"""// CUDA names on the host (tests/cuda_on_host.py): no header, so a kernel compiles fast
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
#define memcpy __builtin_memcpy
static_assert(sizeof(char) == 1 && sizeof(short) == 2 && sizeof(int) == 4 && sizeof(long long) == 8 &&
              sizeof(void*) == 8, "the integer widths of CUDA's data model");
struct uint3 { unsigned x, y, z; };
struct dim3 { unsigned x, y, z; };
struct td_host_indices { uint3 thread, block; dim3 block_dim, grid_dim; };
extern "C" const td_host_indices* td_host_this_thread();
extern "C" void td_host_syncthreads();
extern "C" void td_host_syncwarp();
extern "C" unsigned td_host_activemask();
extern "C" unsigned long long td_host_shuffle(int kind, unsigned long long bits, int arg, int width);
extern "C" int td_host_run(const unsigned* grid, const unsigned* block, void (*entry)(void**), void** args,
                           char* message, int size);
extern "C" unsigned char td_host_dynamic_smem[];
#define threadIdx (td_host_this_thread()->thread)
#define blockIdx (td_host_this_thread()->block)
#define blockDim (td_host_this_thread()->block_dim)
#define gridDim (td_host_this_thread()->grid_dim)
static const int warpSize = 32;
inline void __syncthreads() { td_host_syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { td_host_syncwarp(); }
inline unsigned __activemask() { return td_host_activemask(); }
template <typename T> inline T td_host_shfl(int kind, T v, int arg, int width) {
  static_assert(sizeof(T) <= 8, "a shuffled value has at most 64 bits");
  unsigned long long bits = 0; memcpy(&bits, &v, sizeof(T));
  bits = td_host_shuffle(kind, bits, arg, width);
  T out; memcpy(&out, &bits, sizeof(T)); return out; }
template <typename T> inline T __shfl_sync(unsigned, T v, int lane, int width = 32) {
  return td_host_shfl(0, v, lane, width); }
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
  return td_host_shfl(1, v, mask, width); }
template <typename T> inline T __shfl_up_sync(unsigned, T v, unsigned d, int width = 32) {
  return td_host_shfl(2, v, (int)d, width); }
template <typename T> inline T __shfl_down_sync(unsigned, T v, unsigned d, int width = 32) {
  return td_host_shfl(3, v, (int)d, width); }
// CUDA's integer min / max overloads: the operands' usual arithmetic conversions
template <typename A, typename B> inline auto max(A a, B b) -> decltype(a + b) { return a > b ? a : b; }
template <typename A, typename B> inline auto min(A a, B b) -> decltype(a + b) { return a < b ? a : b; }
inline int abs(int a) { return a < 0 ? -a : a; }
inline long long llabs(long long a) { return a < 0 ? -a : a; }
inline float __int_as_float(int a) { return __builtin_bit_cast(float, a); }
inline int __float_as_int(float a) { return __builtin_bit_cast(int, a); }
inline double __longlong_as_double(long long a) { return __builtin_bit_cast(double, a); }
inline long long __double_as_longlong(double a) { return __builtin_bit_cast(long long, a); }
#define TD_HOST_MATH1(F) inline float F##f(float a) { return __builtin_##F##f(a); } \
  inline float F(float a) { return __builtin_##F##f(a); } inline double F(double a) { return __builtin_##F(a); }
#define TD_HOST_MATH2(F) inline float F##f(float a, float b) { return __builtin_##F##f(a, b); } \
  inline float F(float a, float b) { return __builtin_##F##f(a, b); } \
  inline double F(double a, double b) { return __builtin_##F(a, b); }
TD_HOST_MATH1(exp) TD_HOST_MATH1(exp2) TD_HOST_MATH1(log) TD_HOST_MATH1(log2) TD_HOST_MATH1(sqrt)
TD_HOST_MATH1(sin) TD_HOST_MATH1(cos) TD_HOST_MATH1(tanh) TD_HOST_MATH1(erf) TD_HOST_MATH1(fabs)
TD_HOST_MATH1(asin) TD_HOST_MATH1(acos) TD_HOST_MATH1(atan) TD_HOST_MATH1(sinh) TD_HOST_MATH1(cosh)
TD_HOST_MATH1(asinh) TD_HOST_MATH1(acosh) TD_HOST_MATH1(atanh)
TD_HOST_MATH1(floor) TD_HOST_MATH1(ceil) TD_HOST_MATH1(rint)
TD_HOST_MATH2(pow) TD_HOST_MATH2(fmod) TD_HOST_MATH2(copysign)
inline float rsqrtf(float a) { return 1.0f / __builtin_sqrtf(a); }
inline double rsqrt(double a) { return 1.0 / __builtin_sqrt(a); }
inline float fmaf(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline double fma(double a, double b, double c) { return __builtin_fma(a, b, c); }
// 16-bit floats (the kernel's cuda_fp16.h / cuda_bf16.h includes are dropped). __half is the compiler's IEEE
// binary16: its conversions round to nearest even from any type, as CUDA's do. __nv_bfloat16 holds its bits and
// rounds to nearest even too; from a double through float rounded to odd, which rounds as once from the double.
typedef _Float16 __half;
inline unsigned short td_host_bf16_bits(float f) {
  unsigned u = __builtin_bit_cast(unsigned, f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;      // NaN: the canonical one, as cvt.rn.bf16.f32 gives
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }
inline float td_host_round_to_odd(double d) {
  float f = (float)d;
  if ((double)f == d || d != d) return f;
  if (__builtin_fabs((double)f) > __builtin_fabs(d)) f = __builtin_nextafterf(f, 0.0f);     // toward zero
  return __builtin_bit_cast(float, __builtin_bit_cast(unsigned, f) | 1u); }
struct __nv_bfloat16 {
  unsigned short x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : x(td_host_bf16_bits(f)) {}
  __nv_bfloat16(double d) : x(td_host_bf16_bits(td_host_round_to_odd(d))) {}
  __nv_bfloat16(__half h) : x(td_host_bf16_bits((float)h)) {}
  template <typename I, typename = decltype(I(0) % 1)> __nv_bfloat16(I i) : __nv_bfloat16((double)i) {}
  operator float() const { return __builtin_bit_cast(float, (unsigned)x << 16); } };
static_assert(sizeof(__half) == 2 && sizeof(__nv_bfloat16) == 2, "16-bit floats are two bytes");
// 8-bit floats (the kernel's cuda_fp8.h include is dropped): their bits, converted as cuda_fp8.h converts an f32
// (to nearest even, once; saturated to the largest finite value, inf included; a NaN to 0x7f). The formats'
// arguments are taskdsl.ir.types.FLOAT8_FORMATS' (mantissa bits, bias, largest).
inline unsigned char td_host_fp8_bits(double x, int mant, int bias, double largest) {
  int sign = __builtin_signbit(x) ? 0x80 : 0;
  if (x != x) return 0x7f;
  double a = __builtin_fmin(__builtin_fabs(x), largest);
  if (a == 0.0) return sign;
  int e;
  __builtin_frexp(a, &e);
  int unit = (e - 1 > 1 - bias ? e - 1 : 1 - bias) - mant;
  long long units = (long long)__builtin_nearbyint(__builtin_ldexp(a, -unit));    // ties to even
  if (units < (1 << mant)) return sign | units;
  if (units == (2 << mant)) { units >>= 1; unit += 1; }
  return sign | ((unit + mant + bias) << mant) | (units - (1 << mant)); }
""" + FP8_VALUE + r"""template <int MANT, int BIAS, int LARGEST> struct td_host_fp8 {
  unsigned char __x;
  td_host_fp8() = default;
  explicit td_host_fp8(double d) : __x(td_host_fp8_bits(d, MANT, BIAS, LARGEST)) {}
  explicit td_host_fp8(float f) : td_host_fp8((double)f) {}
  explicit td_host_fp8(__half h) : td_host_fp8((double)(float)h) {}
  explicit td_host_fp8(__nv_bfloat16 b) : td_host_fp8((double)(float)b) {}
  template <typename I, typename = decltype(I(0) % 1)> explicit td_host_fp8(I i) : td_host_fp8((double)i) {}
  explicit operator float() const { return td_host_fp8_value(__x, MANT, BIAS, LARGEST); }
  explicit operator double() const { return (double)(float)*this; }
  explicit operator __half() const { return (__half)(float)*this; }
  explicit operator __nv_bfloat16() const { return __nv_bfloat16((float)*this); }
  explicit operator bool() const { return (__x & 0x7f) != 0; } };
typedef td_host_fp8<3, 7, 448> __nv_fp8_e4m3;
typedef td_host_fp8<2, 15, 57344> __nv_fp8_e5m2;
// Atomics: a block's threads take turns (fibers) and the blocks run one after another, so a plain read-modify-write
// is atomic here; a float sum adds in the turns' order, one of the orders a GPU may take. The value converts to
// the element's type first, as CUDA's parameter does.
template <typename T, typename V> inline T atomicAdd(T* p, V v) { T old = *p; *p = old + (T)v; return old; }
template <typename T, typename V> inline T atomicSub(T* p, V v) { T old = *p; *p = old - (T)v; return old; }
template <typename T, typename V> inline T atomicMax(T* p, V v) { T old = *p; if (old < (T)v) *p = (T)v; return old; }
template <typename T, typename V> inline T atomicMin(T* p, V v) { T old = *p; if ((T)v < old) *p = (T)v; return old; }
template <typename T, typename V> inline T atomicExch(T* p, V v) { T old = *p; *p = (T)v; return old; }
template <typename T> inline T atomicCAS(T* p, T compare, T v) { T old = *p; if (old == compare) *p = v; return old; }
#define TD_HOST_DYNAMIC_SMEM_BYTES @SMEM_BYTES@
extern "C" void td_host_shared(void* array, unsigned long long bytes, unsigned long long* seen);
#define TD_HOST_SHARED(array, bytes) { static unsigned long long td_host_seen; \
  td_host_shared(array, bytes, &td_host_seen); }
""".replace("@SMEM_BYTES@", str(HOST_DYNAMIC_SMEM_BYTES)) + ptx_on_host.SHIM

RUNTIME = r"""// The launch of tests/cuda_on_host.py: a block's threads as fibers, its barriers, warp exchanges.
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <algorithm>
#include <csignal>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

struct uint3 { unsigned x, y, z; };
struct dim3 { unsigned x, y, z; };
struct td_host_indices { uint3 thread, block; dim3 block_dim, grid_dim; };

extern "C" { alignas(16) unsigned char td_host_dynamic_smem[@SMEM_BYTES@]; }

namespace {
struct Aborted {};      // thrown out of a wait when the launch stops (deadlock, error)

struct IntegerDivisionByZero : std::exception {
  const char* what() const noexcept override {
    return "an integer division by zero (or MIN / -1), whose value is unspecified on a GPU (x86 traps)"; }
};
void on_sigfpe(int) { throw IntegerDivisionByZero(); }    // from the trapping instruction (-fnon-call-exceptions)

constexpr int kBlobBytes = 32;                 // the most a lane hands to a warp-wide instruction
constexpr size_t kStackBytes = 1 << 20;        // a fiber's stack, above a guard page (mapped: only used pages cost)

struct Barrier {
  int expected = 0, arrived = 0;
  unsigned long long generation = 0;
};

// A CUDA thread: a fiber with its own stack, run by the block's scheduler until it waits or returns.
struct Fiber {
  ucontext_t context;
  td_host_indices indices;
  int warp, lane;
  int exchanges = 0;                 // the warp-wide instructions it has run
  Barrier* waiting = nullptr;        // the barrier it waits at, for the end of `generation`
  unsigned long long generation = 0;
  bool done = false;
  bool blocked(bool aborted) const { return waiting && waiting->generation == generation && !aborted; }
};

struct Block {
  Barrier block;
  std::vector<Barrier> warps;
  std::vector<Fiber> fibers;
  std::vector<unsigned long long> slots;    // 32 per warp: the values of a shuffle
  std::vector<unsigned char> blobs;         // 2 x 32 per warp: the operands of a warp-wide instruction
  std::vector<long long> stamps;            // 2 x 32 per warp: which instruction each lane is at, and its count
  std::vector<int> lanes;                   // lanes per warp (the last one may be partial)
  ucontext_t scheduler;
  int running = -1, live;
  unsigned long long serial;                // which block of the process this is, counting from 1
  bool aborted = false;
  std::string error;
  Block(int threads, unsigned long long serial)
      : warps((threads + 31) / 32), fibers(threads), slots(32 * warps.size()), blobs(64 * kBlobBytes * warps.size()),
        stamps(64 * warps.size(), -1), lanes(warps.size()), live(threads), serial(serial) {
    block.expected = threads;
    for (size_t w = 0; w < warps.size(); ++w) lanes[w] = warps[w].expected = std::min(32, threads - 32 * (int)w);
  }
  void release(Barrier& b) { b.arrived = 0; ++b.generation; }
  void abort(const std::string& why) {
    if (aborted) return;
    aborted = true; error = why;
  }
};

Block* current = nullptr;
unsigned long long blocks_run = 0;
struct SharedArray { unsigned char* begin; unsigned long long bytes; };
std::vector<SharedArray> shared_arrays;      // those the running block has declared
void (*kernel_entry)(void**);
void** kernel_args;
std::mutex launches;     // one launch at a time: the state above is global

Fiber& me() { return current->fibers[current->running]; }

std::vector<char*> stacks;      // thread t's stack, kept for the next blocks and launches

char* stack_of(int t) {
  while ((int)stacks.size() <= t) {
    void* mapping = mmap(nullptr, kStackBytes + getpagesize(), PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (mapping == MAP_FAILED) throw std::runtime_error("cannot map a fiber's stack");
    mprotect(mapping, getpagesize(), PROT_NONE);      // the guard page: an overflow faults
    stacks.push_back((char*)mapping + getpagesize());
  }
  return stacks[t];
}

void wait(Barrier& b) {      // the fiber yields to the scheduler until the barrier completes
  Block& s = *current;
  Fiber& f = me();
  if (s.aborted) throw Aborted();
  if (b.arrived + 1 == b.expected) { s.release(b); return; }
  ++b.arrived;
  f.waiting = &b;
  f.generation = b.generation;
  swapcontext(&f.context, &s.scheduler);
  f.waiting = nullptr;
  if (b.generation == f.generation) throw Aborted();      // resumed by an abort, not by the barrier
}

void drop(Block& s, Fiber& f) {   // the thread has returned: it no longer holds back its block's or warp's barriers
  --s.live;
  for (Barrier* b : {&s.block, &s.warps[f.warp]}) {
    --b->expected;
    if (b->arrived > 0 && b->arrived == b->expected) s.release(*b);
  }
}

void fiber_main() {
  Block& s = *current;
  Fiber& f = me();
  try {
    if (!s.aborted) kernel_entry(kernel_args);      // a thread first run after an abort does not start
  } catch (const Aborted&) {
  } catch (const std::exception& e) {
    s.abort(e.what());
  } catch (...) {
    s.abort("an unknown C++ exception");
  }
  drop(s, f);
  f.done = true;      // returning resumes the scheduler (uc_link)
}

// Runs the block's fibers in turns, each until it waits or returns: in ascending thread order, then descending
// (odd blocks start ascending, even ones descending), so a read of another thread's write that lacks a barrier
// sees the old value from either side. A turn in which no live fiber can run is a deadlock (a GPU would hang):
// every fiber is resumed to unwind.
void run_block(Block& s, const td_host_indices& first) {
  int threads = (int)s.fibers.size();
  for (int t = 0; t < threads; ++t) {
    Fiber& f = s.fibers[t];
    const dim3& d = first.block_dim;
    f.indices = first;
    f.indices.thread = {t % d.x, t / d.x % d.y, t / (d.x * d.y)};
    f.warp = t / 32; f.lane = t % 32;
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = stack_of(t);
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = &s.scheduler;
    makecontext(&f.context, fiber_main, 0);
  }
  for (bool ascending = s.serial % 2; s.live > 0; ascending = !ascending) {
    bool ran = false;
    for (int k = 0; k < threads; ++k) {
      int t = ascending ? k : threads - 1 - k;
      Fiber& f = s.fibers[t];
      if (f.done || f.blocked(s.aborted)) continue;
      s.running = t;
      swapcontext(&s.scheduler, &f.context);
      ran = true;
    }
    if (!ran)
      s.abort("deadlock: every live thread of the block waits at a __syncthreads or warp operation that the "
              "other threads do not reach (" + std::to_string(s.live) + " threads)");
  }
}
}  // namespace

extern "C" const td_host_indices* td_host_this_thread() { return &me().indices; }
extern "C" void td_host_syncthreads() { wait(current->block); }
extern "C" void td_host_syncwarp() { wait(current->warps[me().warp]); }
extern "C" unsigned td_host_activemask() {
  int n = current->lanes[me().warp];
  return n == 32 ? 0xffffffffu : (1u << n) - 1;
}

// PTX shfl.sync with CUDA's c operand for `width`: lanes form segments of `width`; a source lane outside
// the segment (below it for up, above it for the others) reads the lane's own value.
extern "C" unsigned long long td_host_shuffle(int kind, unsigned long long bits, int arg, int width) {
  Block& s = *current;
  int warp = me().warp, lane = me().lane;
  unsigned long long* slots = &s.slots[32 * warp];
  slots[lane] = bits;
  wait(s.warps[warp]);     // every lane has written its value
  int first = lane & (32 - width), last = first | (width - 1), offset = arg & 31, source;
  bool inside;
  switch (kind) {
    case 0: source = first | (arg & (width - 1)); inside = source <= last; break;     // idx
    case 1: source = lane ^ offset; inside = source <= last; break;                   // xor
    case 2: source = lane - offset; inside = source >= first; break;                  // up
    default: source = lane + offset; inside = source <= last; break;                  // down
  }
  unsigned long long out = inside && source < s.lanes[warp] ? slots[source] : bits;
  wait(s.warps[warp]);     // every lane has read before any writes the next shuffle's value
  return out;
}

// A warp-wide instruction (mma.sync, ldmatrix; tests/ptx_on_host.py): every lane hands in `bytes` of operands
// and receives all 32 lanes' in `all`. The warp's 32 lanes must all be there, at the same instruction (`kind`):
// each stamps its slot with the kind and its count of exchanges, which a lane that is missing does not write.
// Successive exchanges alternate between two areas, so one barrier each is enough: a lane writes an area again
// two exchanges later, past the barrier of the one between, which every lane reaches after reading it.
void warp_exchange(int kind, const char* what, const void* mine, int bytes, void* all) {
  Block& s = *current;
  Fiber& f = me();
  long long count = f.exchanges++, stamp = count << 8 | kind;
  int first = 32 * (2 * f.warp + count % 2);     // this exchange's area: its first lane's slot
  unsigned char* area = &s.blobs[kBlobBytes * first];
  std::memcpy(area + kBlobBytes * f.lane, mine, bytes);
  s.stamps[first + f.lane] = stamp;
  wait(s.warps[f.warp]);     // every lane here has handed in its operands
  int here = 0, same = 0;
  for (int l = 0; l < 32; ++l) {
    here += s.stamps[first + l] >> 8 == count;
    same += s.stamps[first + l] == stamp;
  }
  if (here != 32)
    throw std::runtime_error(std::string(what) + " with " + std::to_string(here) +
                             " of the warp's 32 lanes (.aligned: every lane executes it)");
  if (same != 32)
    throw std::runtime_error(std::string(what) + ": the lanes of a warp are at different warp-wide instructions");
  for (int l = 0; l < 32; ++l) std::memcpy((unsigned char*)all + bytes * l, area + kBlobBytes * l, bytes);
}

// A shared array's declaration (TD_HOST_SHARED after it): the block's first thread there poisons it, since a
// GPU's shared memory holds whatever was there (every byte 0xff: NaN in floats, -1 in integers).
extern "C" void td_host_shared(void* array, unsigned long long bytes, unsigned long long* seen) {
  if (*seen == current->serial) return;      // another thread of the block declared it first
  *seen = current->serial;
  std::memset(array, 0xff, bytes);
  shared_arrays.push_back({(unsigned char*)array, bytes});
}

void begin_ptx_block(int threads);      // tests/ptx_on_host.py's part, appended to this runtime

extern "C" int td_host_run(const unsigned* grid, const unsigned* block, void (*entry)(void**), void** args,
                           char* message, int size) {
  std::lock_guard<std::mutex> launch(launches);
  struct sigaction trap = {}, saved;
  trap.sa_handler = on_sigfpe;
  trap.sa_flags = SA_NODEFER;      // left by a throw, the handler does not unblock the signal itself
  sigaction(SIGFPE, &trap, &saved);
  kernel_entry = entry;
  kernel_args = args;
  int threads = (int)(block[0] * block[1] * block[2]);
  std::string error;
  for (unsigned bz = 0; bz < grid[2] && error.empty(); ++bz)
    for (unsigned by = 0; by < grid[1] && error.empty(); ++by)
      for (unsigned bx = 0; bx < grid[0] && error.empty(); ++bx) {
        Block s(threads, ++blocks_run);
        current = &s;
        shared_arrays.clear();
        begin_ptx_block(threads);
        try {
          run_block(s, {{0, 0, 0}, {bx, by, bz}, {block[0], block[1], block[2]}, {grid[0], grid[1], grid[2]}});
        } catch (const std::exception& e) {
          s.abort(e.what());
        }
        if (s.aborted)
          error = "block (" + std::to_string(bx) + ", " + std::to_string(by) + ", " + std::to_string(bz) + "): " +
                  s.error;
        current = nullptr;
      }
  sigaction(SIGFPE, &saved, nullptr);
  if (error.empty()) return 0;
  std::strncpy(message, error.c_str(), size - 1);
  message[size - 1] = 0;
  return 1;
}
""".replace("@SMEM_BYTES@", str(HOST_DYNAMIC_SMEM_BYTES)) + FP8_VALUE + ptx_on_host.RUNTIME

_HALF_HEADERS = re.compile(r"#include <cuda_(fp16|bf16|fp8)\.h>")
_SIGNATURE = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(([^)]*)\)')
_DYNAMIC_SHARED = re.compile(r"extern __shared__ __align__\(16\) unsigned char td_dynamic_smem\[\];")
_STATIC_SHARED = re.compile(r"(__shared__ __align__\(16\) [\w ]+? (\w+)\[\d+\];)")
_MESSAGE_BYTES = 1024
_EMPTY_BYTES = 256     # an empty array's memory: a GPU allocates at least a byte, in blocks of 256 or more


class UnsupportedSource(Exception):
    """A CUDA source that uses what the host shim cannot run faithfully."""


class DivisionByZeroOnHost(RuntimeError):
    """A host run stopped at an integer division by zero: x86 traps where a GPU gives an unspecified value."""


def host_compiler() -> str | None:
    """The host C++ compiler: $CXX, else g++, else clang++ on the PATH (None if there is none)."""
    for name in (os.environ.get("CXX"), "g++", "clang++"):
        path = shutil.which(name) if name else None
        if path:
            return path
    return None


def unsupported(source: str) -> str | None:
    """Why the shim cannot run CUDA `source` on the host, or None when it can."""
    try:
        ptx_on_host.translate(source)
    except ptx_on_host.Unsupported as exc:
        return str(exc)
    return None


def entry_params(source: str) -> list:
    """Whether each parameter of CUDA `source`'s `__global__` function is a pointer, and a written one."""
    signature = _SIGNATURE.search(source)
    assert signature is not None, "no __global__ function in the CUDA source"
    return kernel_params(source, signature[1])


def run_on_host(kernel, *args, **kwargs) -> None:
    """Run `kernel`'s generated CUDA C++ on the host for a call's arguments, writing into the numpy arrays."""
    args = kernel.arguments(args, kwargs)
    binding = kernel.bind(args, "cuda")     # the grid, block and typed arguments a GPU launch gets
    if 0 not in binding.grid:
        run_source(kernel.source(*args, target="cuda"), binding.grid, binding.block, binding.values, kernel.name)


def run_source(source: str, grid: tuple, block: tuple, values: list, name: str = "kernel",
               in_place: bool = False) -> None:
    """Run the `__global__` function of CUDA `source` on the host: 3-d `grid` x `block`, `values` its numpy
    arrays and numpy scalars in parameter order. Each array gets its own copy, as a GPU launch's numpy arguments
    do, unless `in_place` (the C-contiguous arrays are the "device memory", aliases included). An empty array is
    a zeroed scrap of memory, as a GPU's allocation of at least a byte is."""
    why = unsupported(source)
    if why is not None:
        raise UnsupportedSource(f"kernel '{name}': its CUDA source uses {why}")
    signature = _SIGNATURE.search(source)
    assert signature is not None, f"kernel '{name}': no __global__ function in its CUDA source"
    symbol, param_text = signature.groups()
    params = kernel_params(source, symbol)
    c_types = [p.rsplit(None, 1)[0] for p in filter(None, (p.strip() for p in param_text.split(",")))]
    assert len(c_types) == len(values), f"kernel '{name}': {len(c_types)} C parameters, {len(values)} values"
    library = _library(source, symbol, c_types)
    keep, pointers, copy_back = [], [], []
    for value, info in zip(values, params):
        if info.pointer:
            assert isinstance(value, np.ndarray), f"kernel '{name}': {value!r} for a pointer parameter"
            host = value if in_place and value.flags.c_contiguous else np.array(value, order="C", copy=True)
            if info.writable and host is not value:
                copy_back.append((value, host))
            if not host.size:
                host = np.zeros(_EMPTY_BYTES, np.uint8)
            slot = np.array(host.ctypes.data, np.uintp)   # the argument: a pointer
            keep += [host, slot]
            pointers.append(slot.ctypes.data)
        else:
            assert isinstance(value, np.generic), f"kernel '{name}': scalars must be typed (numpy), got {value!r}"
            scalar = np.array(value)
            keep.append(scalar)
            pointers.append(scalar.ctypes.data)
    message = ctypes.create_string_buffer(_MESSAGE_BYTES)
    dims = [(ctypes.c_uint * 3)(*d) for d in (grid, block)]
    status = library.td_host_launch(*dims, (ctypes.c_void_p * max(1, len(pointers)))(*pointers), message,
                                    _MESSAGE_BYTES)
    if status != 0:
        text = message.value.decode(errors="replace")
        error = DivisionByZeroOnHost if "integer division by zero" in text else RuntimeError   # the runtime's words
        raise error(f"kernel '{name}' on the host: {text}")
    for value, host in copy_back:
        np.copyto(value, host)


# ------------------------------------------------------------------ building
_loaded: dict = {}
_lock = threading.Lock()


def _cache_dir() -> Path:
    path = Path(tempfile.gettempdir()) / f"taskdsl_cuda_on_host_{os.getuid()}"
    path.mkdir(exist_ok=True)
    return path


def _build(text: str, stem: str, extra: tuple = ()) -> Path:
    """The shared library of C++ `text`, compiled once per text, compiler and flags (cached on disk)."""
    compiler = host_compiler()
    if compiler is None:
        raise RuntimeError("no host C++ compiler ($CXX, g++ or clang++)")
    key = hashlib.sha256("\0".join((compiler, *FLAGS, *extra, text)).encode()).hexdigest()[:24]
    library = _cache_dir() / f"{stem}_{key}.so"
    if not library.exists():
        # this process's and thread's own source and output: another pytest-xdist worker (or another run sharing
        # $TMPDIR) building the same library rewrote a shared .cpp (truncated, then written) while g++ read it
        mine = f"{os.getpid()}.{threading.get_ident()}"
        source = library.with_name(f"{library.stem}.{mine}.cpp")
        source.write_text(text)
        partial = library.with_name(f"{library.name}.{mine}")   # renamed when whole
        result = subprocess.run([compiler, *FLAGS, "-shared", "-pthread", "-o", str(partial), str(source), *extra],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} cannot compile {source}:\n{result.stderr[-4000:]}")
        os.replace(partial, library)
        source.unlink(missing_ok=True)
    return library


def _runtime() -> Path:
    return _build(RUNTIME, "runtime", ("-O2",))     # compiled once: worth optimizing


def _host_shared(source: str) -> str:
    """`source` with each shared array declared to the runtime (poisoned per block; ldmatrix's and cp.async's
    bounds), the dynamic one in the runtime's buffer."""
    source = _DYNAMIC_SHARED.sub("unsigned char* td_dynamic_smem = td_host_dynamic_smem; "
                                 "TD_HOST_SHARED(td_dynamic_smem, TD_HOST_DYNAMIC_SMEM_BYTES)", source)
    source, declared = _STATIC_SHARED.subn(r"\1 TD_HOST_SHARED(\2, sizeof(\2))", source)
    assert declared == source.count("__shared__"), "a __shared__ declaration the host shim does not know"
    return source


def _library(source: str, symbol: str, c_types: list):
    """The loaded library of a kernel's CUDA source, with its launcher `td_host_launch`."""
    source = _host_shared(ptx_on_host.translate(source))
    source = _HALF_HEADERS.sub("", source)     # the shim defines the 16- and 8-bit float types
    arguments = ", ".join(f"*({t}*)args[{k}]" for k, t in enumerate(c_types))
    launcher = (f'#line 1 "td_host_launcher"\n'
                f"static void td_host_entry(void** args) {{ {symbol}({arguments}); }}\n"
                'extern "C" int td_host_launch(const unsigned* grid, const unsigned* block, void** args, '
                "char* message, int size) {\n"
                "  return td_host_run(grid, block, td_host_entry, args, message, size); }\n")
    text = KERNEL_SHIM + '#line 1 "cuda_source"\n' + source + launcher
    with _lock:
        runtime = _runtime()
        # -Bsymbolic: the launcher calls this library's kernel, not a function of its name loaded earlier (libm's fdiv)
        path = _build(text, symbol, (str(runtime), "-lm", "-Wl,-Bsymbolic"))
        if path not in _loaded:
            library = ctypes.CDLL(str(path))
            library.td_host_launch.restype = ctypes.c_int
            library.td_host_launch.argtypes = [ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint),
                                               ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_int]
            _loaded[path] = library
        return _loaded[path]
