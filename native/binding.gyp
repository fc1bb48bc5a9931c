{
  "targets": [
    {
      "target_name": "weft",
      "sources": [
        "src/addon.cc",
        "src/netlink.cc",
        "src/checksum.cc",
        "src/packet.cc",
        "src/peer_table.cc",
        "src/codec.cc",
        "src/flannel_udp.cc",
        "src/vxlan.cc",
        "src/ipip.cc",
        "src/tun.cc",
        "src/udp_socket.cc",
        "src/engine.cc",
        "src/tap_tx.cc",
        "src/steering.cc",
        "src/coalesce.cc",
        "src/harness.cc",
        "src/sd_notify.cc",
        "src/bpf_loader.cc",
        "src/wg_crypto.cc",
        "src/wg_noise.cc",
        "src/wg_session.cc",
        "src/wg_device.cc",
        "src/wg_harness.cc",
        "src/wg_engine.cc"
      ],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": ["NAPI_VERSION=9", "NODE_ADDON_API_DISABLE_DEPRECATED", "NAPI_CPP_EXCEPTIONS"],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions", "-std=gnu++17"],
      "cflags_cc": ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fexceptions"],
      "libraries": ["-lmnl", "-lbpf", "-lcrypto"]
    }
  ]
}
