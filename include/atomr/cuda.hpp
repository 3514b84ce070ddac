// Umbrella header: everything public in atomr-accel-cuda.
#pragma once

#include <atomr/cuda/async.hpp>
#include <atomr/cuda/completion.hpp>
#include <atomr/cuda/compose.hpp>
#include <atomr/cuda/graph.hpp>
#if ATOMR_CUDA_HAS_CUBLAS
#include <atomr/cuda/blas_actor.hpp>
#include <atomr/cuda/collective_actor.hpp>
#endif
#include <atomr/cuda/copy.hpp>
#if ATOMR_CUDA_HAS_CUDNN
#include <atomr/cuda/cudnn_actor.hpp>
#endif
#include <atomr/cuda/device.hpp>
#include <atomr/cuda/element.hpp>
#include <atomr/cuda/error.hpp>
#if ATOMR_CUDA_HAS_CUFFT
#include <atomr/cuda/fft_actor.hpp>
#endif
#include <atomr/cuda/gpu_ref.hpp>
#include <atomr/cuda/pinned.hpp>
#include <atomr/cuda/placement.hpp>
#if ATOMR_CUDA_HAS_CURAND
#include <atomr/cuda/rng_actor.hpp>
#endif
#include <atomr/cuda/run_kernel.hpp>
#include <atomr/cuda/stream.hpp>
#include <atomr/cuda/supervision.hpp>

/// \namespace atomr::cuda
/// The public API of atomr-accel-cuda: devices and their streams, device and
/// pinned buffers, transfers, the library actors (cuBLAS, cuFFT, cuRAND,
/// cuDNN), run_kernel for your own CUDA calls, composed and recorded units,
/// and errors as values (result, gpu_error). Every asynchronous operation is
/// an awaitable on Boost.Asio, and also takes any Asio completion token.
/// Names in atomr::cuda::detail are the library's own and may change.
