# `make package`: a Debian package, accelerant_<version>_amd64.deb, of what `cmake --install`
# installs. The library is static, so a program built against it needs the development packages
# of everything the library links (Depends); the CLI needs LibTorch's runtime, which they bring.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME accelerant)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "Accelerant maintainers <maintainers@users.noreply.a-seed-56766671.example>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "distributed training for LibTorch C++ programs")
# The synopsis is CPACK_PACKAGE_DESCRIPTION_SUMMARY; the long description follows, wrapped at 80
# columns as Debian wants (CPack indents each line).
string(CONCAT CPACK_DEBIAN_PACKAGE_DESCRIPTION
  "Accelerant runs one LibTorch training loop unchanged on one CPU, many\n"
  "processes, GPUs and many machines: bucketed gradient all-reduce, mixed\n"
  "precision, crash-safe checkpoints with exact resume, fused optimizers and\n"
  "graph capture. This package holds the static library, its headers, the CMake\n"
  "package (find_package(Accelerant)) and the accelerant command-line tool.")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # accelerant_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libc6, libgcc-s1, libstdc++6, libtorch-dev (>= 1.13), libgloo-dev, libopenblas0-pthread, libyaml-cpp-dev, nlohmann-json3-dev, zlib1g-dev, cmake (>= 3.21)")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS OFF)  # the Depends above bring every shared library the CLI uses
set(CPACK_STRIP_FILES ON)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
include(CPack)
