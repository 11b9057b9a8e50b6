// The launch configuration of every kernel in the image: block sizes, shared memory, tile sizes and which
// instantiations exist. Plain C++17 with no header, compiled by NVRTC into the kernels (which static_assert their
// layouts against it) and by g++ into the library's planner (cuda/launch_plan.cc), so each value is written once.
// Why each value is what it is: docs/design-notes.md.
#pragma once

namespace launch_config {

// Kernel name suffix per element type, in the order of the library's ElemType (float32, float16, bfloat16).
inline constexpr const char* kTypeSuffix[] = {"f32", "f16", "bf16"};

// ---- GatedDeltaNet, recurrent engine (gdn_recurrent.cu) ----
inline constexpr int kRecWarps = 4;  // warps per block
// Instantiated key sizes: a call takes the smallest that holds its key head size.
inline constexpr int kRecKeySizes[] = {32, 64, 128, 256, 512};
inline constexpr int kRecKeyCount = sizeof(kRecKeySizes) / sizeof(kRecKeySizes[0]);
// Per key size: the value rows per warp instantiated (0 = none). Fewer rows per warp mean more warps in flight;
// more rows share the per-token work (loads, gate, norms).
inline constexpr int kRecRowVariants[kRecKeyCount][4] = {{1, 2, 4, 8}, {1, 2, 4, 8}, {1, 2, 4, 8}, {2, 4}, {1, 2}};
// Default rows per warp: the most when the batch gives several row groups per warp, else the small-batch choice
// (docs/design-notes.md#rows-and-row-groups-per-warp).
inline constexpr int kRecRowsLarge[kRecKeyCount] = {8, 8, 8, 4, 2};
inline constexpr int kRecRowsSmall[kRecKeyCount] = {4, 4, 4, 4, 2};
// Tokens per row whose per-token prologue a general kernel's block runs in one pass (two chunks); calls whose
// rows average more take one row group per warp, which keeps its state in registers from chunk to chunk.
inline constexpr int kRecBlockTokens[kRecKeyCount] = {8, 8, 8, 4, 2};
// Calls of at most one token per row take a `_decode` instantiation (a loop of its own, bitwise the same), only
// for the real models' shapes: these rows per warp (0 = none) at each key size, for the types marked 1 (ElemType
// order). Each decode instantiation is a second loop: for every shape they grew the image by 66%.
inline constexpr int kRecDecodeRows[kRecKeyCount][4] = {{}, {}, {4, 8}, {}, {}};
inline constexpr int kRecDecodeTypes[] = {0, 1, 1};
// Row groups per warp grow (1, 2, 4) while the grid keeps at least this many blocks
// (docs/design-notes.md#decode-with-one-row-group-per-warp).
inline constexpr int kRecMinBlocks = 1024;
// Value rows per warp (rows x row groups) at most: a warp loads its rows' values in one access per token.
inline constexpr int kRecMaxWarpRows = 32;

// ---- GatedDeltaNet, chunked engine (gdn_chunked.cu) ----
inline constexpr int kChunkD = 128;        // Dk = Dv
inline constexpr int kChunkTokens = 64;    // tokens per chunk
inline constexpr int kChunkThreads = 256;  // the prep kernel's block
// The scan's value columns per CTA: the narrow width while its grid has at most kChunkNarrowMaxBlocks CTAs (one
// wave on an H200's 132 SMs), beyond it the wide one (docs/design-notes.md#scan-width).
inline constexpr int kChunkVt = 64;
inline constexpr int kChunkVtWide = 128;
inline constexpr int kChunkNarrowMaxBlocks = 132;
// Dynamic shared memory of the scan (narrow, wide) on mma.sync, every image but sm_90's.
inline constexpr int kChunkSmemBytes = 141824;
inline constexpr int kChunkWideSmemBytes = 158208;
// The sm_90 image (sm_90a) runs the scan on wgmma: the narrow width adds a producer warpgroup of
// kChunkWgmmaProducerThreads threads that fills three stages; both widths stage their output rows in shared memory.
inline constexpr int kChunkWgmmaArch = 90;
inline constexpr int kChunkWgmmaSmemBytes = 211968;
inline constexpr int kChunkWgmmaWideSmemBytes = 168960;
inline constexpr int kChunkWgmmaProducerThreads = 128;
inline constexpr int kChunkPrepSmemBytes = 115200;
// The prep kernel serves a key head's whole group of value heads per block while that grid keeps at least this
// many blocks (two per SM on an H200); below it, one value head per block.
inline constexpr int kChunkPrepSharedMinBlocks = 264;

// ---- VarlenCausalConvWithState (conv.cu) ----
inline constexpr int kConvThreads = 128;
inline constexpr int kConvVectorBytes = 16;  // channels per thread: 16 bytes (8 at 16-bit types, 4 at fp32)
// Tokens per thread of the output pass (the kernel reads its run length from the grid's height): one token at
// most kConvShortTokens tokens in all, runs of kConvTokens from kConvLongTokens on, else of kConvMediumTokens
// (docs/design-notes.md#conv-output-loop-and-run-length).
inline constexpr int kConvShortTokens = 256;
inline constexpr int kConvMediumTokens = 8;
inline constexpr int kConvTokens = 16;
inline constexpr int kConvLongTokens = 2048;
// At most this many tokens per row on average (decode, verify): one fused launch per (row, channels).
inline constexpr int kConvRowTokens = 8;

// ---- GatedDeltaNet capsule replay (gdn_replay.cu) ----
inline constexpr int kReplayWarps = 2;
inline constexpr int kReplayRows = 8;  // value rows per warp: 4 KB of state in flight per warp at Dk = 128

// ---- LinearRows (linear.cu) ----
inline constexpr int kLinearWarps = 8;    // warps per block
inline constexpr int kLinearAhead = 4;    // 16-byte pieces of w each lane has requested before using one
// Warps per output feature double (1, 2, 4, 8) until the grid has at least this many warps, while each lane keeps
// kLinearAhead pieces (docs/design-notes.md#linearrows).
inline constexpr int kLinearMinWarps = 32768;
inline constexpr int kLinearSwigluThreads = 256;  // linear_swiglu_*: one output element per thread

// ---- QuantizedLinear (quantized_linear.cu) ----
inline constexpr int kQlinearWarps = 8;   // warps per block
// Segments (2 x 16 bytes of weights a lane) requested before using one. Two, not four: fewer registers, more
// resident warps (an H100 at four: 98 registers, 16 warps an SM, 0.68 eligible a scheduler; two: 9B projections at
// one row 1.8-2.5 TB/s instead of 1.6-2.4).
inline constexpr int kQlinearAhead = 2;
inline constexpr int kQlinearMaxRowTiles = 8;  // qlinear_mma_* serves up to 8 rows of x per tile, 64 in all
// The row tiles of x at which a warp of the _aligned kernels takes two weight row tiles (16 rows each) instead of
// one: at 9-16 rows x comes from L1, 16 lines a load at 8 rows, and a second weight tile halves the loads per weight
// byte. One at one row tile (its lanes share x lines) and at four and eight (registers: 172 a thread at four); one
// in the general kernels (177-187 at two).
inline constexpr int kQlinearTwoWeightTilesAt = 2;
// Warps per group of 16 features double (1, 2, 4, 8) until the grid has at least this many warps, while each warp
// keeps two segments.
// 2048: qkv and gate|up of 9B split k in 2 instead of 4, 12-18% faster at 1 and 16 rows in ORT sessions on an H100
// than 4096 (o_proj and down unchanged; docs/benchmarks-e2e-gpu.md run P); 8192 was slower.
inline constexpr int kQlinearMinWarps = 2048;
// qlinear_row_*: a warp's lane groups (lanes 4g .. 4g + 3, the rows of an mma fragment), each a split of k.
inline constexpr int kQlinearLaneGroups = 8;
// qlinear_row_*: feature pairs a lane group takes (each x load serves 2 x this many weight rows). One: 64 registers,
// four blocks an SM; two (100 registers) read the 9B projections 0-4% slower on an H100.
inline constexpr int kQlinearRowPairs = 1;
inline constexpr int kQlinearDequantizeThreads = 256;  // qlinear_dequantize_*: 8 elements per thread

}  // namespace launch_config
