{
  "targets": [
    {
      "target_name": "cuda_ipc",
      "sources": [
        "native/addon.cc",
        "native/driver.cc",
        "native/device.cc",
        "native/peer.cc",
        "native/memory.cc",
        "native/pool_exports.cc",
        "native/legacy_ipc.cc",
        "native/stream.cc",
        "native/module.cc",
        "native/copy.cc",
        "native/nvrtc.cc",
        "native/fd.cc",
        "native/socket.cc",
        "native/shared_memory.cc",
        "native/channel.cc",
        "native/c_ring.cc",
        "native/py/channel_ring.c",
        "native/nccl.cc"
      ],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": ["NAPI_VERSION=8", "NODE_ADDON_API_DISABLE_DEPRECATED", "NAPI_CPP_EXCEPTIONS"],
      "cflags_c": ["-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"],
      "cflags_cc": ["-std=c++17", "-fexceptions", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"],
      "cflags_cc!": ["-fno-exceptions"],
      "libraries": ["-ldl", "-lpthread"]
    },
    {
      "target_name": "cuda_ipc_py",
      "type": "shared_library",
      "product_prefix": "",
      "product_dir": "<(PRODUCT_DIR)",
      "sources": ["native/py/channel_ring.c", "native/py/link_send.c", "native/py/torch_pool.cc"],
      "cflags_c": ["-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"],
      "cflags_cc!": ["-fno-exceptions"],
      "cflags_cc": ["-std=c++17", "-fexceptions", "-fno-rtti", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"],
      "ldflags": ["-Wl,--as-needed", "-Wl,-z,now"],
      "libraries": ["-ldl", "-lpthread"]
    }
  ]
}
