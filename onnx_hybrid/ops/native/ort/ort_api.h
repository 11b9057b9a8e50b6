// The ORT C++ API without a link dependency on libonnxruntime: the function table comes from
// RegisterCustomOps (Ort::InitApi), never from OrtGetApiBase().
#pragma once

#define ORT_API_MANUAL_INIT
#include "onnxruntime_cxx_api.h"
#undef ORT_API_MANUAL_INIT

#if ORT_API_VERSION != 21
#error "onnx_hybrid is built against ONNX Runtime API 21 headers (libonnxruntime-dev 1.21.0); see fetch_ort_headers.sh"
#endif
