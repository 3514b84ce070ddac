// Umbrella header: everything public in atomr-accel-cuda.
#pragma once

#include <atomr/cuda/async.hpp>
#include <atomr/cuda/completion.hpp>
#include <atomr/cuda/compose.hpp>
#include <atomr/cuda/graph.hpp>
#if ATOMR_CUDA_HAS_CUBLAS
#include <atomr/cuda/blas_actor.hpp>
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
#if ATOMR_CUDA_HAS_CURAND
#include <atomr/cuda/rng_actor.hpp>
#endif
#include <atomr/cuda/run_kernel.hpp>
#include <atomr/cuda/stream.hpp>
#include <atomr/cuda/supervision.hpp>
