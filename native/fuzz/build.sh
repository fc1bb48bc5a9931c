#!/bin/sh
# Builds the libFuzzer decap target with clang: native/fuzz/build.sh OUT_BINARY
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/decap_fuzzer}
src=$here/../src
exec clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$src" "$here/decap_fuzzer.cc" "$src/checksum.cc" "$src/packet.cc" "$src/peer_table.cc" \
  "$src/codec.cc" "$src/flannel_udp.cc" "$src/vxlan.cc" "$src/ipip.cc" \
  "$src/coalesce.cc" "$src/wg_crypto.cc" "$src/wg_noise.cc" "$src/wg_session.cc" \
  "$src/wg_device.cc" -lcrypto -o "$out"
