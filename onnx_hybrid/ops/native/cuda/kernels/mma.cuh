// Warp-level tensor-core helpers: ldmatrix fragment loads and mma.sync.m16n8k16 (fp16 in, fp32 accumulate).
// Fragment layouts are the PTX ISA's: A 16x16 row-major, B 16x8 "col" (stored as [n][k]), C 16x8 with
// thread (lane) holding rows lane/4 and lane/4 + 8, columns 2*(lane%4) and 2*(lane%4) + 1.
#pragma once
#include <cuda_fp16.h>

#include "common.cuh"

namespace ohk {

// A fragment of a 16x16 tile at `tile` (row-major, leading dimension ld halves).
__device__ __forceinline__ void ldmatrix_a(unsigned (&a)[4], const __half* tile, int ld, int lane) {
  const __half* p = tile + (lane & 15) * ld + (lane >> 4) * 8;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(smem_addr(p)));
}

// B fragment (16 k x 8 n) from storage [n][k] (k contiguous), tile at (n0, k0).
__device__ __forceinline__ void ldmatrix_b(unsigned (&b)[2], const __half* tile, int ld, int lane) {
  const __half* p = tile + (lane & 7) * ld + ((lane >> 3) & 1) * 8;
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(b[0]), "=r"(b[1])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four transposed 8x8 tiles of 16-bit elements (any 16-bit type). Lane l addresses row l % 8 of tile l / 8 at
// `row`; r[i] receives tile i transposed: this lane holds its stored rows 2 (lane % 4) and 2 (lane % 4) + 1 at
// stored column lane / 4, i.e. the C-fragment layout of the tile's transpose.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

#if __CUDA_ARCH__ >= 900
// The inverse of ldmatrix_x4_trans (sm_90+): r[i] holds tile i in the fragment layout (lane: row lane/4, columns
// 2 (lane%4) + {0, 1}) and is stored transposed, lane l giving the address of stored row l % 8 of tile l / 8
// (16 bytes: the tile's column l % 8). The "memory" clobber keeps later shared-memory reads after it.
__device__ __forceinline__ void stmatrix_x4_trans(const unsigned (&r)[4], unsigned smem_address) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(smem_address), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
#endif

// The x4 loads below fetch the fragments of two adjacent 8-wide n tiles at once: out[i] is tile n0 + 8 i.

// B fragments of n tiles (n0, n0 + 8), 16 k each, from storage [n][k] (k contiguous), tile at (n0, k0).
__device__ __forceinline__ void ldmatrix_b_pair(unsigned (&b)[2][2], const __half* tile, int ld, int lane) {
  const __half* p = tile + ((lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(b[0][0]), "=r"(b[0][1]), "=r"(b[1][0]), "=r"(b[1][1])
               : "r"(smem_addr(p)));
}

// B fragments of n tiles (n0, n0 + 8), 16 k each, from storage [k][n] (n contiguous), tile at (k0, n0).
__device__ __forceinline__ void ldmatrix_b_pair_trans(unsigned (&b)[2][2], const __half* tile, int ld, int lane) {
  unsigned r[4];
  ldmatrix_x4_trans(r, tile + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8);
  b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}

// A 16 m x 16 n tile in the accumulator layout, as fp16 pairs, from storage [n][m] (m contiguous), tile at
// (n0, m0): c[i][0] holds rows lane/4, c[i][1] rows lane/4 + 8 of n tile n0 + 8 i.
__device__ __forceinline__ void ldmatrix_c_pair_trans(unsigned (&c)[2][2], const __half* tile, int ld, int lane) {
  unsigned r[4];
  ldmatrix_x4_trans(r, tile + ((lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8);
  c[0][0] = r[0], c[0][1] = r[1], c[1][0] = r[2], c[1][1] = r[3];
}

// Transpose of an 8x8 tile of 16-bit pairs held in the fragment layout (lane: row lane/4, columns
// 2 (lane%4) + {0, 1}): afterwards lane holds row lane/4 of the transposed tile. Registers only (sm_75+).
__device__ __forceinline__ unsigned movmatrix_trans(unsigned x) {
  unsigned y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

}  // namespace ohk
