#!/usr/bin/env bash
# The documentation check of the public API (meson test --suite docs): runs
# doxygen over include/atomr/ with the project's Doxyfile (EXTRACT_ALL=NO,
# WARN_IF_UNDOCUMENTED=YES; the detail namespace and headers excluded) and
# fails when it writes any warning: a public symbol of namespace atomr::cuda
# without documentation, or an error in a documentation comment.
# Exit 77 (meson: SKIP), with the reason, when doxygen is not installed.
#
# Usage: api-docs-check.sh DOXYFILE WORKDIR [DOXYGEN]
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 DOXYFILE WORKDIR [DOXYGEN]" >&2
  exit 64
fi
doxyfile=$1
work=$2
doxygen=${3:-}
[ -n "$doxygen" ] || doxygen=$(command -v doxygen || true)
if [ -z "$doxygen" ]; then
  echo "SKIP: the API documentation check needs doxygen (Debian 12: apt-get install doxygen)"
  exit 77
fi

rm -rf "$work"
mkdir -p "$work"
log=$work/warnings.log
# The Doxyfile, then the settings this check depends on (later lines win).
# XML only: doxygen reports undocumented members while writing its output.
if ! {
  cat "$doxyfile"
  printf '%s\n' "OUTPUT_DIRECTORY = $work" "WARN_LOGFILE = $log" "QUIET = YES" \
    "EXTRACT_ALL = NO" "WARN_IF_UNDOCUMENTED = YES" "WARN_IF_DOC_ERROR = YES" \
    "GENERATE_HTML = NO" "GENERATE_LATEX = NO" "GENERATE_XML = YES"
} | "$doxygen" - >"$work/doxygen.out" 2>&1; then
  cat "$work/doxygen.out"
  echo "FAIL: doxygen did not run to the end"
  exit 1
fi
if [ -s "$log" ]; then
  cat "$log"
  echo "FAIL: $(grep -c . "$log") doxygen warning(s) above: document every public symbol" \
    "of namespace atomr::cuda in include/atomr/ (/// comments; detail is exempt)"
  exit 1
fi
echo "OK: every public symbol in include/atomr/ is documented ($("$doxygen" --version))"
