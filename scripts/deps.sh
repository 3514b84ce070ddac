#!/usr/bin/env bash
# Installs the Debian 12 packages the build needs, if any are missing.
# The CUDA toolkit itself (with cuDNN) is expected under /usr/local/cuda.
set -eu
pkgs="libboost1.81-dev doctest-dev meson ninja-build pkg-config g++"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "installing:$missing"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
