// Private: the pause instruction of a spin-wait loop (the poll hub's launch
// threads, the isolated device's reply reader and the worker's ring threads).
#pragma once

namespace atomr::cuda::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace atomr::cuda::detail
