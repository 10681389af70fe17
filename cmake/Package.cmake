# `make package`: a Debian package, accelerant_<version>_amd64.deb, of what `cmake --install`
# installs. The library is static, so a program built against it needs the development packages
# of everything the library links (Depends); the CLI needs LibTorch's runtime, which they bring.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME accelerant)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "Accelerant developers <accelerant@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_DESCRIPTION
    "Accelerant runs one LibTorch (PyTorch C++) training loop unchanged on one CPU, many processes, GPUs and many machines, with bucketed gradient all-reduce, mixed precision, crash-safe checkpoints with exact resume, fused optimizers and graph capture. This package holds the static library, its headers, the CMake package (find_package(Accelerant)) and the accelerant command-line tool (launch, config, env, test, checkpoint).")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # accelerant_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://github.com/accelerant/accelerant")
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libtorch-dev (>= 1.13), libgloo-dev, libopenblas0-pthread, libyaml-cpp-dev, nlohmann-json3-dev, zlib1g-dev, cmake (>= 3.21)")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS OFF)  # the Depends above bring every shared library the CLI uses
set(CPACK_STRIP_FILES ON)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
include(CPack)
