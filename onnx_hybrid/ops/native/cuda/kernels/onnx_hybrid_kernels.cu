// The one translation unit NVRTC compiles into the image (cubin) for a device: every kernel of
// onnx_hybrid.cuda_ops, all `extern "C"` with explicit per-type names for driver-API lookup.
#include "gdn_recurrent.cu"
#include "gdn_chunked.cu"
#include "conv.cu"
#include "gdn_replay.cu"
#include "linear.cu"
#include "quantized_linear.cu"
