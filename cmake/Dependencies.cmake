# What the library needs, found the same way for a top-level build and a subproject. The
# installed package's AccelerantConfig.cmake finds the same set (cmake/AccelerantConfig.cmake.in).

# Debian's libtorch-dev provides TorchConfig.cmake; a CUDA LibTorch 2.x is found the same way
# through CMAKE_PREFIX_PATH (see docs/building.md).
find_package(Torch REQUIRED)
# find_package's imported targets are visible only in this directory and below. Accelerant links
# them publicly, so a parent project that never called find_package(Torch) must see them too.
foreach(torch_target torch torch_library torch_cpu torch_cuda c10 c10_cuda)
  if(TARGET ${torch_target})
    get_target_property(already_global ${torch_target} IMPORTED_GLOBAL)
    if(NOT already_global)
      set_target_properties(${torch_target} PROPERTIES IMPORTED_GLOBAL TRUE)
    endif()
  endif()
endforeach()
find_package(Gloo QUIET)                     # c10d's ProcessGroupGloo headers include gloo's
find_package(Threads REQUIRED)
find_package(CLI11 CONFIG REQUIRED)          # the CLI and examples (libcli11-dev)
find_package(yaml-cpp CONFIG REQUIRED)       # config files (libyaml-cpp-dev)
find_package(nlohmann_json CONFIG REQUIRED)  # checkpoint manifests, jsonl_files (nlohmann-json3-dev)
find_package(ZLIB REQUIRED)                  # CRC-32 of checkpoint files (zlib1g-dev)
find_package(Protobuf REQUIRED)              # TensorBoard event files (libprotobuf-dev, protobuf-compiler)
# Linked as ${Protobuf_LIBRARIES}, not protobuf::libprotobuf: pip's LibTorch 2.x defines a target of
# that name with no library in it, and FindProtobuf keeps a target that already exists.
