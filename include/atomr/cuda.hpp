// Umbrella header: everything public in atomr-accel-cuda.
#pragma once

#include <atomr/cuda/completion.hpp>
#include <atomr/cuda/copy.hpp>
#include <atomr/cuda/device.hpp>
#include <atomr/cuda/element.hpp>
#include <atomr/cuda/error.hpp>
#include <atomr/cuda/gpu_ref.hpp>
#include <atomr/cuda/pinned.hpp>
#include <atomr/cuda/run_kernel.hpp>
#include <atomr/cuda/stream.hpp>
#include <atomr/cuda/supervision.hpp>
