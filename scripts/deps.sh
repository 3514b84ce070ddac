#!/usr/bin/env bash
# Checks that this machine has what the build needs, by looking for the tools,
# headers and libraries themselves (not for packages), and installs what is
# missing with apt-get where apt is usable, under Debian 12's package names.
# Elsewhere (e.g. a machine without network or without apt) it names what is
# missing and how to provide it, and exits 1. Exits 0 when the build can run.
#
# Needs: a C++20 compiler (g++ >= 12 or clang++ >= 16; $CXX, else c++), meson
# >= 1.0, ninja, python3, Boost >= 1.81 headers with Asio and Outcome, the
# CUDA toolkit (>= 12) under $TOOLKIT_PREFIX (default /usr/local/cuda).
# Wanted, but the build runs without: the doctest header (else meson downloads
# it through subprojects/doctest.wrap), pkg-config (else the consumer test
# skips its pkg-config half), doxygen (else there is no api-docs target and
# the docs test, which checks that every public symbol is documented,
# reports SKIP), cuDNN (else the cuDNN actor is left out).
#
# Environment: CXX, TOOLKIT_PREFIX; DEPS_NO_INSTALL=1 only checks;
# DEPS_OPTIONAL=1 also installs the wanted items when only they are missing
# (CI sets it, so that the docs test runs there instead of skipping).
set -u

toolkit=${TOOLKIT_PREFIX:-/usr/local/cuda}
cxx=${CXX:-c++}

missing=()      # "what|package|what to do": what the build cannot do without
notes=()        # things that only reduce what is built or tested
to_install=()   # Debian 12 packages for the missing items

need() { missing+=("$1"); [ -n "$2" ] && to_install+=("$2"); }

# version_ge A B: true when version A >= B (dotted numbers).
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]; }

# compiles stdin as C++20 with $cxx.
compiles() { "$cxx" -std=c++20 -x c++ -fsyntax-only - >/dev/null 2>&1; }
# preprocesses stdin as C++20 (enough to find headers and test versions; fast).
preprocesses() { "$cxx" -std=c++20 -x c++ -E "$@" - >/dev/null 2>&1; }

check_compiler() {
  if ! command -v "$cxx" >/dev/null 2>&1; then
    need "a C++ compiler ($cxx not found)" g++
    return
  fi
  # g++ >= 12 or clang >= 16 with coroutines, concepts and <span>.
  if ! compiles <<'EOF'; then
#if defined(__clang__)
#if __clang_major__ < 16
#error clang too old
#endif
#elif defined(__GNUC__) && __GNUC__ < 12
#error g++ too old
#endif
#include <concepts>
#include <coroutine>
#include <span>
int main() {}
EOF
    need "a C++20 compiler: $cxx ($("$cxx" --version 2>/dev/null | head -1)) is older than g++ 12 / clang 16 or lacks C++20" g++
  fi
}

check_meson() {
  local v
  if ! v=$(meson --version 2>/dev/null); then
    need "meson >= 1.0 (not found)" meson
  elif ! version_ge "$v" 1.0; then
    need "meson >= 1.0 (found $v)" meson
  fi
}

check_ninja() {
  command -v ninja >/dev/null 2>&1 || command -v samu >/dev/null 2>&1 ||
    need "ninja (not found)" ninja-build
}

check_python() {
  command -v python3 >/dev/null 2>&1 || need "python3 (not found; the docs' snippets are extracted with it)" python3
}

check_boost() {
  command -v "$cxx" >/dev/null 2>&1 || return  # reported above
  if ! preprocesses <<'EOF'; then
#include <boost/version.hpp>
#if BOOST_VERSION < 108100
#error Boost too old
#endif
#include <boost/asio/awaitable.hpp>
#include <boost/outcome.hpp>
int main() {}
EOF
    local found=""
    found=$(printf '#include <boost/version.hpp>\nBOOST_LIB_VERSION\n' |
      "$cxx" -E -P -x c++ - 2>/dev/null | tail -1)
    need "Boost >= 1.81 headers with Asio and Outcome (found: ${found:-none})" libboost1.81-dev
  fi
}

check_doctest() {
  command -v "$cxx" >/dev/null 2>&1 || return
  printf '#include <doctest/doctest.h>\n' | preprocesses ||
    need "the doctest header <doctest/doctest.h> (optional: without it meson falls back to subprojects/doctest.wrap, which needs network to download doctest)" doctest-dev
}

check_pkg_config() {
  command -v pkg-config >/dev/null 2>&1 || command -v pkgconf >/dev/null 2>&1 ||
    need "pkg-config (optional: the consumer test checks the installed .pc file with it)" pkg-config
}

check_doxygen() {
  command -v doxygen >/dev/null 2>&1 ||
    need "doxygen (optional: the API reference, ninja -C build api-docs, and the docs test, which checks that every public symbol is documented, need it)" doxygen
}

check_cuda() {
  local ok=1
  [ -f "$toolkit/include/cuda_runtime_api.h" ] || ok=0
  compgen -G "$toolkit/lib64/libcudart.so*" >/dev/null || ok=0
  if [ "$ok" = 0 ]; then
    # Not a Debian package here: NVIDIA's installer or repository provides it.
    missing+=("the CUDA toolkit >= 12 under $toolkit (include/cuda_runtime_api.h, lib64/libcudart.so): install it from NVIDIA, or set TOOLKIT_PREFIX (and meson's -Dtoolkit_prefix) to where it is")
    return
  fi
  if ! [ -f "$toolkit/include/cudnn.h" ] && ! printf '#include <cudnn.h>\n' | preprocesses -isystem "$toolkit/include"; then
    notes+=("cuDNN not found (cudnn.h in $toolkit/include or the default paths): the cuDNN actor is not built")
  fi
}

optional_missing() { [[ $1 == *"(optional:"* ]]; }

check_all() {
  missing=()
  notes=()
  to_install=()
  check_compiler
  check_meson
  check_ninja
  check_python
  check_boost
  check_doctest
  check_pkg_config
  check_doxygen
  check_cuda
}

# apt is usable: apt-get exists, and we are root or may sudo without a password.
apt_usable() {
  command -v apt-get >/dev/null 2>&1 || return 1
  [ "$(id -u)" -eq 0 ] && return 0
  command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null
}

# True when something the build cannot do without is missing (optional items
# alone never start apt: on a machine without network, as the GPU machine,
# that would only cost time).
required_missing() {
  local m
  for m in "${missing[@]}"; do optional_missing "$m" || return 0; done
  return 1
}

check_all
tried_apt=0
if [ ${#to_install[@]} -gt 0 ] && { required_missing || [ "${DEPS_OPTIONAL:-0}" = 1 ]; } &&
  [ "${DEPS_NO_INSTALL:-0}" != 1 ] && apt_usable; then
  tried_apt=1
  # One package may cover several items; install each once.
  pkgs=$(printf '%s\n' "${to_install[@]}" | sort -u | tr '\n' ' ')
  echo "deps: installing with apt-get: $pkgs"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo -n"
  # shellcheck disable=SC2086
  if ! { $sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $pkgs >/dev/null; }; then
    echo "deps: apt-get could not install them (no network, or not Debian 12's package names?)"
  fi
  check_all
fi

for n in "${notes[@]}"; do echo "deps: note: $n"; done
fatal=0
for m in "${missing[@]}"; do
  if optional_missing "$m"; then
    echo "deps: warning: missing $m"
  else
    echo "deps: MISSING: $m"
    fatal=1
  fi
done
[ "$fatal" = 0 ] && exit 0
if [ ${#to_install[@]} -gt 0 ]; then
  pkgs=$(printf '%s\n' "${to_install[@]}" | sort -u | tr '\n' ' ')
  if [ "$tried_apt" = 0 ]; then
    if [ "${DEPS_NO_INSTALL:-0}" = 1 ]; then
      why="DEPS_NO_INSTALL=1"
    elif command -v apt-get >/dev/null 2>&1; then
      why="not root, and sudo needs a password"
    else
      why="no apt-get here"
    fi
    echo "deps: nothing was installed ($why)."
  fi
  echo "deps: on Debian 12: apt-get install $pkgs"
  echo "deps: elsewhere: install the items above with the system's package manager (meson and ninja also come with 'pip install meson ninja'), then run this again."
fi
exit 1
