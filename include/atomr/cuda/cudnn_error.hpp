// Classification of cuDNN statuses; built only when cuDNN is enabled.
#pragma once

#include <cudnn.h>

#include <string_view>

#include "atomr/cuda/error.hpp"

namespace atomr::cuda {

/// A gpu_error tagged "cudnn" whose native status is the cudnnStatus_t number.
/// CUDNN_STATUS_SUCCESS and CUDNN_STATUS_RUNTIME_IN_PROGRESS are not failures and give errc::ok.
gpu_error classify(cudnnStatus_t status, std::string_view context = {});

/// The code alone: by exact value where cuDNN 9 names it, else by family (value / 1000).
errc classify_code(cudnnStatus_t status) noexcept;

}  // namespace atomr::cuda
