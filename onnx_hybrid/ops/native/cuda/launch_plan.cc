#include "cuda/launch_plan.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "cuda/kernels/launch_config.h"

namespace onnx_hybrid {
namespace {

namespace cp = launch_config;

std::atomic<GdnCudaEngine> g_gdn_engine{GdnCudaEngine::kAuto};

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

unsigned U(int64_t v) { return static_cast<unsigned>(v); }

const char* Suffix(ElemType type) { return cp::kTypeSuffix[static_cast<int>(type)]; }

const char* TypeName(ElemType type) {
  return type == ElemType::kFloat16 ? "float16" : type == ElemType::kBFloat16 ? "bfloat16" : "float32";
}

bool Aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

// The chunked kernels' vector loads and stores: 8-byte q/k/v, 16-byte output and state rows.
bool ChunkedAligned(const GdnParams& p) {
  return Aligned(p.q, 8) && Aligned(p.k, 8) && Aligned(p.v, 8) && Aligned(p.out, 16) && Aligned(p.state_in, 16) &&
         Aligned(p.state_out, 16);
}

// Dynamic shared memory of the scan of width vt in the image for sm_<arch>.
int ChunkScanSmemBytes(int vt, int arch) {
  if (arch == cp::kChunkWgmmaArch) return vt == cp::kChunkVt ? cp::kChunkWgmmaSmemBytes : cp::kChunkWgmmaWideSmemBytes;
  return vt == cp::kChunkVt ? cp::kChunkSmemBytes : cp::kChunkWideSmemBytes;
}

// Opt-in shared memory per block that every chunked kernel variant of the arch's image fits in.
int ChunkSmemNeeded(int arch) {
  return std::max({ChunkScanSmemBytes(cp::kChunkVt, arch), ChunkScanSmemBytes(cp::kChunkVtWide, arch),
                   cp::kChunkPrepSmemBytes});
}

// The scan's block: a warp per 16 value columns, plus the wgmma narrow width's producer warpgroup.
int ChunkScanThreads(int vt, int arch) {
  const int producers = arch == cp::kChunkWgmmaArch && vt == cp::kChunkVt ? cp::kChunkWgmmaProducerThreads : 0;
  return vt / 16 * 32 + producers;
}

// The narrow scan while its grid fits one wave (kChunkNarrowMaxBlocks CTAs), else the wide one.
int ChunkScanWidth(const GdnGeometry& geo) {
  const int64_t narrow_blocks = int64_t(geo.head_size_v / cp::kChunkVt) * geo.num_heads_v * geo.batch;
  return narrow_blocks <= cp::kChunkNarrowMaxBlocks ? cp::kChunkVt : cp::kChunkVtWide;
}

// Row groups per warp: several only when the grid stays large, so small batches keep every SM busy.
int RecRowGroups(const GdnGeometry& geo, int rows) {
  const int64_t warps = geo.batch * geo.num_heads_v * CeilDiv(geo.head_size_v, rows);
  int groups = 1;
  while (groups < 4 && warps / (2 * groups * cp::kRecWarps) >= cp::kRecMinBlocks) groups *= 2;
  return groups;
}

// The shapes with a `_decode` instantiation of the recurrent kernel.
bool HasDecodeInstantiation(ElemType type, int key, int rows) {
  if (!cp::kRecDecodeTypes[static_cast<int>(type)]) return false;
  for (int r : cp::kRecDecodeRows[key])
    if (r == rows) return true;
  return false;
}

// Whether the recurrent kernel has an instantiation of `rows` value rows per warp.
bool IsRowVariant(int key, int rows) {
  for (int r : cp::kRecRowVariants[key])
    if (r != 0 && r == rows) return true;
  return false;
}

// Blocks of kConvThreads threads of kConvVectorBytes of channels each.
unsigned ConvChannelBlocks(int64_t channels, ElemType type) {
  return U(CeilDiv(channels, cp::kConvThreads * (cp::kConvVectorBytes / int64_t(ElemSize(type)))));
}

}  // namespace

KernelName::KernelName(const char* prefix, ElemType type) { Append(prefix).Append(Suffix(type)); }

KernelName& KernelName::Append(const char* text) {
  const size_t n = std::strlen(text);
  if (size_ + n >= sizeof text_) throw std::length_error(std::string("kernel name too long: ") + text_ + text);
  std::memcpy(text_ + size_, text, n + 1);
  size_ += n;
  return *this;
}

KernelName& KernelName::Append(int value) {
  char digits[12] = {};
  std::to_chars(digits, digits + sizeof digits - 1, value);
  return Append(digits);
}

void SetGdnCudaEngine(GdnCudaEngine engine) { g_gdn_engine.store(engine); }
GdnCudaEngine GetGdnCudaEngine() { return g_gdn_engine.load(); }

int64_t ChunkWorkspaceBytes(const GdnGeometry& geo) {
  return geo.total_tokens * (2 * geo.num_heads_v * (cp::kChunkD + cp::kChunkTokens) +
                             2 * 2 * geo.num_heads_k * cp::kChunkD + 4 * geo.num_heads_v);
}

bool GdnUsesChunked(const GdnGeometry& geo, ElemType type, const GdnParams& params, int arch, int smem_optin,
                    GdnCudaEngine engine) {
  const bool aligned = ChunkedAligned(params);
  const bool chunked = type != ElemType::kFloat && geo.head_size_k == cp::kChunkD && geo.head_size_v == cp::kChunkD &&
                       !geo.per_key_decay && arch >= 80 && smem_optin >= ChunkSmemNeeded(arch) && aligned;
  if (engine == GdnCudaEngine::kChunked && !chunked)
    throw std::invalid_argument(
        std::string("the chunked engine needs float16/bfloat16, head sizes 128/128, scalar decay and sm_80+; got ") +
        TypeName(type) + ", " + std::to_string(geo.head_size_k) + "/" + std::to_string(geo.head_size_v) +
        ", per-key decay " + (geo.per_key_decay ? "True" : "False") + ", sm_" + std::to_string(arch) + " with " +
        std::to_string(smem_optin) + " B of opt-in shared memory (needs " + std::to_string(ChunkSmemNeeded(arch)) +
        "), aligned inputs " + (aligned ? "True" : "False"));
  return chunked && (engine == GdnCudaEngine::kChunked ||
                     (engine == GdnCudaEngine::kAuto && geo.total_tokens >= int64_t(contract::kSequentialMinTokens) * geo.batch));
}

std::vector<CudaLaunch<GdnParams>> PlanGdn(const GdnGeometry& geo, ElemType type, const GdnParams& params, int arch,
                                           int smem_optin, const GdnPlanKnobs& knobs) {
  constexpr int kKeySizes = sizeof(cp::kRecKeySizes) / sizeof(cp::kRecKeySizes[0]);
  int key = 0;
  while (key < kKeySizes && geo.head_size_k > cp::kRecKeySizes[key]) ++key;
  if (key == kKeySizes)
    throw std::invalid_argument("no supported plan (head_size_qk " + std::to_string(geo.head_size_k) + " > " +
                             std::to_string(cp::kRecKeySizes[kKeySizes - 1]) + ")");
  const bool use_chunked = GdnUsesChunked(geo, type, params, arch, smem_optin, knobs.engine);
  std::vector<CudaLaunch<GdnParams>> launches;
  if (use_chunked) {
    // The chunk count of well-formed offsets (each row adds at most one partial chunk); the kernel strides over
    // any excess that malformed offsets make.
    const int64_t prep_blocks = (geo.total_tokens + (cp::kChunkTokens - 1) * geo.batch) / cp::kChunkTokens;
    // A key head's whole group of value heads per block while that grid stays large enough, else one.
    const int64_t group = geo.num_heads_v / geo.num_heads_k;
    int64_t prep_heads = prep_blocks * geo.num_heads_k >= cp::kChunkPrepSharedMinBlocks ? group : 1;
    if (knobs.prep_heads != 0) {
      if (knobs.prep_heads < 1 || group % knobs.prep_heads)
        throw std::invalid_argument("prep_heads " + std::to_string(knobs.prep_heads) +
                                    " does not divide the value heads per key head (" + std::to_string(group) + ")");
      prep_heads = knobs.prep_heads;
    }
    launches.push_back({KernelName("gdn_chunk_prep_", type).Append("_d").Append(cp::kChunkD),
                        {U(prep_blocks), U(geo.num_heads_v / prep_heads), 1},
                        {U(cp::kChunkThreads), 1, 1},
                        cp::kChunkPrepSmemBytes,
                        params});
    const int vt = knobs.scan_width != 0 ? knobs.scan_width : ChunkScanWidth(geo);
    if (vt != cp::kChunkVt && vt != cp::kChunkVtWide)
      throw std::invalid_argument("scan_width " + std::to_string(vt) + " is not instantiated: (" +
                                  std::to_string(cp::kChunkVt) + ", " + std::to_string(cp::kChunkVtWide) + ")");
    launches.push_back({KernelName("gdn_chunked_", type).Append("_d").Append(cp::kChunkD).Append("_v").Append(vt),
                        {U(geo.head_size_v / vt), U(geo.num_heads_v), U(geo.batch)},
                        {U(ChunkScanThreads(vt, arch)), 1, 1},
                        ChunkScanSmemBytes(vt, arch),
                        params});
  }
  GdnParams rec = params;
  rec.tail_only = use_chunked ? 1 : 0;
  const int large = cp::kRecRowsLarge[key];
  const int rows = knobs.rec_rows != 0 ? knobs.rec_rows
                                       : RecRowGroups(geo, large) > 1 ? large : cp::kRecRowsSmall[key];
  if (!IsRowVariant(key, rows)) {
    std::string variants;
    for (int r : cp::kRecRowVariants[key])
      if (r) variants += (variants.empty() ? "" : ", ") + std::to_string(r);
    throw std::invalid_argument("rec_rows " + std::to_string(rows) + " is not instantiated for key size " +
                                std::to_string(cp::kRecKeySizes[key]) + ": (" + variants + ")");
  }
  const bool decode = geo.total_tokens <= geo.batch && HasDecodeInstantiation(type, key, rows);
  // Decode kernels take one group per warp, and so do calls of long rows (kRecBlockTokens).
  const bool long_rows = !use_chunked && geo.total_tokens > int64_t(cp::kRecBlockTokens[key]) * geo.batch;
  rec.row_groups = knobs.rec_groups != 0 ? knobs.rec_groups : decode || long_rows ? 1 : RecRowGroups(geo, rows);
  if (rows * rec.row_groups > cp::kRecMaxWarpRows)
    throw std::invalid_argument("rec_rows " + std::to_string(rows) + " x rec_groups " + std::to_string(rec.row_groups) +
                                " exceeds " + std::to_string(cp::kRecMaxWarpRows) + " value rows per warp");
  const int64_t rows_per_block = int64_t(cp::kRecWarps) * rows * rec.row_groups;
  KernelName recurrent("gdn_recurrent_", type);
  recurrent.Append("_k").Append(cp::kRecKeySizes[key]).Append("_r").Append(rows);
  if (decode) recurrent.Append("_decode");
  launches.push_back({recurrent,
                      {U(CeilDiv(geo.head_size_v, rows_per_block)), U(geo.num_heads_v), U(geo.batch)},
                      {U(cp::kRecWarps * 32), 1, 1},
                      0,
                      rec});
  return launches;
}

bool ConvStatesOverlap(const ConvGeometry& geo, ElemType type, const ConvParams& params) {
  const auto nbytes = static_cast<uintptr_t>(geo.batch * geo.channels * geo.state_length) * ElemSize(type);
  const auto in = reinterpret_cast<uintptr_t>(params.state_in), out = reinterpret_cast<uintptr_t>(params.state_out);
  return in < out + nbytes && out < in + nbytes;
}

std::vector<CudaLaunch<ConvParams>> PlanConv(const ConvGeometry& geo, ElemType type, const ConvParams& params) {
  const unsigned cx = ConvChannelBlocks(geo.channels, type);
  const cuda::Dim3 block{U(cp::kConvThreads), 1, 1};
  if (geo.total_tokens <= int64_t(cp::kConvRowTokens) * geo.batch)  // short rows: both passes in one launch
    return {{KernelName(geo.total_tokens <= geo.batch ? "conv_decode_" : "conv_rows_", type), {cx, U(geo.batch), 1},
             block, 0, params}};
  // One token per thread for short calls, long runs for long ones.
  const int64_t tokens_per_block = geo.total_tokens <= cp::kConvShortTokens ? 1
                                   : geo.total_tokens >= cp::kConvLongTokens ? cp::kConvTokens
                                                                             : cp::kConvMediumTokens;
  // The state pass is the output grid's first rows unless the two states overlap.
  ConvParams output = params;
  output.state_rows = ConvStatesOverlap(geo, type, params) ? 0 : static_cast<int>(geo.batch);
  std::vector<CudaLaunch<ConvParams>> launches{
      {KernelName("conv_output_", type), {cx, U(output.state_rows + CeilDiv(geo.total_tokens, tokens_per_block)), 1},
       block, 0, output}};
  if (output.state_rows == 0)
    launches.push_back({KernelName("conv_state_", type), {cx, U(geo.batch), 1}, block, 0, params});
  return launches;
}

std::vector<CudaLaunch<GdnReplayParams>> PlanGdnReplay(const GdnReplayParams& params) {
  return {{KernelName("gdn_replay_", ElemType::kFloat),
           {U(CeilDiv(params.dv, cp::kReplayWarps * cp::kReplayRows)), U(params.hv), U(params.batch)},
           {U(cp::kReplayWarps * 32), 1, 1},
           0,
           params}};
}

std::vector<CudaLaunch<ConvReplayParams>> PlanConvReplay(ElemType type, const ConvReplayParams& params) {
  return {{KernelName("conv_replay_", type), {ConvChannelBlocks(params.channels, type), U(params.batch), 1},
           {U(cp::kConvThreads), 1, 1}, 0, params}};
}

bool LinearUsesRows(ElemType type, const LinearParams& params) {
  // n == INT32_MAX: clamped by MakeLinearParams, so a size only cuBLAS may refuse.
  return type != ElemType::kFloat && params.rows == 1 && params.k % 8 == 0 && params.n < INT32_MAX &&
         Aligned(params.x, 16) && Aligned(params.w, 16);
}

std::vector<CudaLaunch<LinearParams>> PlanLinear(ElemType type, const LinearParams& params) {
  LinearParams p = params;
  p.splits = 1;
  // More warps per feature while the grid is short of kLinearMinWarps and each lane keeps kLinearAhead pieces.
  const int64_t pieces = p.k / 8;
  while (p.splits < cp::kLinearWarps && int64_t(p.n) * p.splits < cp::kLinearMinWarps &&
         pieces >= int64_t(2) * p.splits * 32 * cp::kLinearAhead)
    p.splits *= 2;
  return {{KernelName(p.swiglu ? "linear_rows_swiglu_" : "linear_rows_", type),
           {U(CeilDiv(p.n, cp::kLinearWarps / p.splits)), 1, 1}, {U(cp::kLinearWarps * 32), 1, 1}, 0, p}};
}

std::vector<CudaLaunch<LinearParams>> PlanLinearSwiglu(ElemType type, const LinearParams& params) {
  return {{KernelName("linear_swiglu_", type),
           {U(CeilDiv(int64_t(params.rows) * params.n, cp::kLinearSwigluThreads)), 1, 1},
           {U(cp::kLinearSwigluThreads), 1, 1}, 0, params}};
}

bool QuantizedLinearUsesMma(ElemType type, const LinearParams& params) {
  return type != ElemType::kFloat && params.rows <= cp::kQlinearMaxRowTiles * 8 && params.k % 32 == 0 &&
         params.block_size % 32 == 0 && params.n < INT32_MAX && Aligned(params.x, 16) && Aligned(params.w, 16);
}

std::vector<CudaLaunch<LinearParams>> PlanQuantizedLinear(ElemType type, const LinearParams& params) {
  LinearParams p = params;
  int tiles = 1;
  while (tiles * 8 < p.rows) tiles *= 2;
  const int64_t groups = CeilDiv(p.n, p.swiglu ? 8 : 16), segments = CeilDiv(p.k, 128);
  p.splits = 1;  // warps a row tile: at least two segments each (the kernel's runs are never empty)
  while (p.splits < cp::kQlinearWarps && groups * p.splits < cp::kQlinearMinWarps &&
         segments >= int64_t(4) * p.splits)
    p.splits *= 2;
  // Whole segments, blocks of at most a segment and no zero points: the variant without per-piece selects.
  const bool aligned = p.k % 128 == 0 && p.block_size <= 128 && p.zero_points == nullptr;
  if (p.rows == 1) {  // qlinear_row_*: each lane group a split, so a warp holds lane groups / splits slots of pairs
    const int64_t pairs = p.swiglu ? p.n : CeilDiv(p.n, 2);
    const int64_t warps = CeilDiv(pairs, (cp::kQlinearLaneGroups / p.splits) * cp::kQlinearRowPairs);
    return {{KernelName(p.swiglu ? "qlinear_row_swiglu_" : "qlinear_row_", type).Append(aligned ? "_aligned" : ""),
             {U(CeilDiv(warps, cp::kQlinearWarps)), 1, 1}, {U(cp::kQlinearWarps * 32), 1, 1}, 0, p}};
  }
  const int64_t warp_groups = CeilDiv(groups, aligned && tiles == cp::kQlinearTwoWeightTilesAt ? 2 : 1);
  return {{KernelName(p.swiglu ? "qlinear_mma_swiglu_" : "qlinear_mma_", type)
               .Append("_t")
               .Append(tiles)
               .Append(aligned ? "_aligned" : ""),
           {U(CeilDiv(warp_groups, cp::kQlinearWarps / p.splits)), 1, 1}, {U(cp::kQlinearWarps * 32), 1, 1}, 0, p}};
}

std::vector<CudaLaunch<LinearParams>> PlanQuantizedLinearDequantize(ElemType type, const LinearParams& params) {
  const int64_t words = int64_t(params.swiglu ? 2 : 1) * params.n * (params.k / 8);
  return {{KernelName("qlinear_dequantize_", type), {U(CeilDiv(words, cp::kQlinearDequantizeThreads)), 1, 1},
           {U(cp::kQlinearDequantizeThreads), 1, 1}, 0, params}};
}

}  // namespace onnx_hybrid
