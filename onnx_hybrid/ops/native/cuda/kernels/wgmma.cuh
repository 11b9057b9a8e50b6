// Warpgroup-level tensor-core helpers (sm_90a only): wgmma.mma_async with A from registers, B in shared memory
// in the 128-byte-swizzled canonical layout, fp16 operands, fp32 accumulators. Include only when
// __CUDA_ARCH_FEAT_SM90_ALL is defined.
//
// Register layouts (PTX ISA, "wgmma register fragments"), per warp w of the warpgroup and lane l:
// * accumulator of m64nNk16: rows 16 w + l/4 and + 8; d[i][0..1] are row l/4, columns 8 i + 2 (l%4) + {0, 1},
//   d[i][2..3] the same columns of row l/4 + 8. Tile i is exactly an mma.m16n8 C fragment.
// * A from registers (16 x 16 per warp): the mma.m16n8k16 A fragment, {(r, c), (r + 8, c), (r, c + 8),
//   (r + 8, c + 8)} for r = l/4, c = 2 (l%4), each register an fp16 pair of columns c, c + 1.
// So two adjacent accumulator tiles, packed to fp16 pairs, are one k-16 A fragment.
//
// Shared-memory operand B (K x N) through a 64-bit matrix descriptor (PTX ISA, "matrix descriptor"):
// bits 0-13 start address >> 4, 16-29 leading-dimension byte offset (LBO) >> 4, 32-45 stride-dimension byte
// offset (SBO) >> 4, 49-51 base offset (0: every swizzle atom starts on a 1024-byte boundary), 62-63 swizzle
// (1 = 128B). In the 128B-swizzle mode a swizzle atom is 8 rows of 128 bytes, and the 16-byte chunk c of row r
// (r = address bits 7-9) is stored at chunk c ^ r. Which dimension the rows run along depends on the major-ness:
// * K-major (trans-b 0; a row holds 64 consecutive k of one n): SBO = distance between groups of 8 rows (n);
//   LBO is unused (set to 16 bytes). A k step of 16 fp16 inside the atom advances the start address by 32 B:
//   the hardware applies the XOR to the address it forms, so the stored chunk (2 j + c) ^ r is found.
// * MN-major (trans-b 1; a row holds 64 consecutive n of one k): SBO = distance between groups of 8 rows (k),
//   LBO = distance between atoms along n (N > 64).
#pragma once

namespace ohk {

constexpr unsigned kWgmmaSwizzleBytes = 128;  // one row of a swizzle atom
constexpr unsigned kWgmmaAtomBytes = 8 * kWgmmaSwizzleBytes;

// Byte offset, inside a 1024-byte-aligned region of rows of 128 bytes, of the 16-byte chunk `chunk` (0..7) of
// row `row`: the 128B swizzle that the descriptors below declare.
__device__ __forceinline__ unsigned swizzle128_offset(unsigned row, unsigned chunk) {
  return row * kWgmmaSwizzleBytes + ((chunk ^ (row & 7)) << 4);
}

__device__ __forceinline__ unsigned long long wgmma_desc_sw128(unsigned smem_address, unsigned lbo, unsigned sbo) {
  const unsigned lo = ((smem_address & 0x3FFFF) >> 4) | ((lbo >> 4) << 16);
  const unsigned hi = (sbo >> 4) | (1u << 30);  // bit 62: 128B swizzle
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

// The same descriptor with its start address moved by `bytes` (a multiple of 16; stays inside the window).
__device__ __forceinline__ unsigned long long wgmma_desc_advance(unsigned long long desc, unsigned bytes) {
  return desc + (bytes >> 4);
}

// Orders this thread's register writes before the wgmma that follow (needed before the first wgmma after
// ordinary instructions wrote its accumulator or A registers).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups of this warp are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Pins a register at this point of the instruction stream: the compiler can neither move a read of an
// accumulator above the wgmma_wait that completes it nor sink a write below the wgmma_fence that publishes it.
__device__ __forceinline__ void register_fence(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void register_fence(unsigned& x) { asm volatile("" : "+r"(x)::"memory"); }
template <typename R, int M, int N>
__device__ __forceinline__ void register_fence(R (&x)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int j = 0; j < N; ++j) register_fence(x[i][j]);
}

// Generic-proxy writes to shared memory (st.shared, cp.async) -> reads by wgmma (async proxy): each writing
// thread fences after its writes have completed, then a barrier.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

#define OHK_WGMMA_RS(SHAPE, DREGS, AREGS, DESC, SCALE_D, TRANS_B)                                   \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE_D ", 0;\n"                                              \
  "wgmma.mma_async.sync.aligned." SHAPE ".f32.f16.f16 " DREGS ", " AREGS ", " DESC ", p, 1, 1, " TRANS_B \
  ";\n}\n"
#define OHK_ACC(d, i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define OHK_WGMMA_APPLY(m, ...) m(__VA_ARGS__)  // expands the arguments first
// The operand numbers of an n128 product: 64 accumulator registers, 4 of A, the descriptor, scale-d, trans-b.
#define OHK_N128_OPERANDS                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "                \
  "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "                 \
  "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "                 \
  "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}",                           \
      "{%64, %65, %66, %67}", "%68", "%69", "%70"
#define OHK_WGMMA_IN(a, desc, scale_d, trans_b) \
  "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d), "n"(trans_b)

// D (+)= A B for an m64 n(8 TILES) k16 product, d holding the accumulator tiles of the warpgroup's 64 rows
// (tile i = column tile i of the product). accumulate = 0 ignores the old contents of d. TRANS_B: 0 if B is
// K-major in shared memory, 1 if MN-major. The widths the scan uses: n64 (the narrow width's X and Y, and O)
// and n128 (the state).
template <int TILES, int TRANS_B>
__device__ __forceinline__ void wgmma_m64k16_rs(float (&d)[TILES][4], const unsigned (&a)[4], unsigned long long b_desc,
                                                int accumulate) {
  if constexpr (TILES == 8) {
    asm volatile(OHK_WGMMA_RS("m64n64k16",
                              "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
                              "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}",
                              "{%32, %33, %34, %35}", "%36", "%37", "%38")
                 : OHK_ACC(d, 0), OHK_ACC(d, 1), OHK_ACC(d, 2), OHK_ACC(d, 3), OHK_ACC(d, 4), OHK_ACC(d, 5),
                   OHK_ACC(d, 6), OHK_ACC(d, 7)
                 : OHK_WGMMA_IN(a, b_desc, accumulate, TRANS_B));
  } else {
    static_assert(TILES == 16, "instantiated widths: n64, n128");
    asm volatile(OHK_WGMMA_APPLY(OHK_WGMMA_RS, "m64n128k16", OHK_N128_OPERANDS)
                 : OHK_ACC(d, 0), OHK_ACC(d, 1), OHK_ACC(d, 2), OHK_ACC(d, 3), OHK_ACC(d, 4), OHK_ACC(d, 5),
                   OHK_ACC(d, 6), OHK_ACC(d, 7), OHK_ACC(d, 8), OHK_ACC(d, 9), OHK_ACC(d, 10), OHK_ACC(d, 11),
                   OHK_ACC(d, 12), OHK_ACC(d, 13), OHK_ACC(d, 14), OHK_ACC(d, 15)
                 : OHK_WGMMA_IN(a, b_desc, accumulate, TRANS_B));
  }
}

// The n128 product with its accumulator tiles split over two arrays: lo holds tiles 0-7 (columns 0-63), hi
// tiles 8-15 (columns 64-127). Two n64 products sharing one A (the scan's X and Y) as one instruction.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n128k16_rs_split(float (&lo)[8][4], float (&hi)[8][4], const unsigned (&a)[4],
                                                          unsigned long long b_desc, int accumulate) {
  asm volatile(OHK_WGMMA_APPLY(OHK_WGMMA_RS, "m64n128k16", OHK_N128_OPERANDS)
               : OHK_ACC(lo, 0), OHK_ACC(lo, 1), OHK_ACC(lo, 2), OHK_ACC(lo, 3), OHK_ACC(lo, 4), OHK_ACC(lo, 5),
                 OHK_ACC(lo, 6), OHK_ACC(lo, 7), OHK_ACC(hi, 0), OHK_ACC(hi, 1), OHK_ACC(hi, 2), OHK_ACC(hi, 3),
                 OHK_ACC(hi, 4), OHK_ACC(hi, 5), OHK_ACC(hi, 6), OHK_ACC(hi, 7)
               : OHK_WGMMA_IN(a, b_desc, accumulate, TRANS_B));
}

#undef OHK_WGMMA_RS
#undef OHK_ACC
#undef OHK_WGMMA_IN
#undef OHK_N128_OPERANDS
#undef OHK_WGMMA_APPLY

}  // namespace ohk
