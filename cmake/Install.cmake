# `cmake --install`: the library, its public headers (and the generated version.h), the CLI, the
# docs and a CMake package, so that another project's find_package(Accelerant 0.2) gives
# Accelerant::accelerant with its dependencies and C++17. docs/using.md shows the three ways in.
include(CMakePackageConfigHelpers)

set(ACCELERANT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Accelerant)

install(TARGETS accelerant EXPORT AccelerantTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS accelerant_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The helper that runs `accelerant env` and `test` (they need LibTorch; the front end does not load
# it). The front end finds it at the same path relative to itself as in the build tree.
install(TARGETS accelerant_libtorch RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/accelerant)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/accelerant ${PROJECT_BINARY_DIR}/include/accelerant
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(EXPORT AccelerantTargets NAMESPACE Accelerant:: DESTINATION ${ACCELERANT_CMAKE_DIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/AccelerantConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/AccelerantConfig.cmake
                              INSTALL_DESTINATION ${ACCELERANT_CMAKE_DIR})
# 0.x: a minor release may change the API, so 0.2 accepts 0.2.* only.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/AccelerantConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/AccelerantConfig.cmake ${PROJECT_BINARY_DIR}/AccelerantConfigVersion.cmake
        DESTINATION ${ACCELERANT_CMAKE_DIR})

install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
# The API reference, when `make docs` has built it (make package does; a plain install may not).
if(ACCELERANT_API_DOCS_DIR)
  install(DIRECTORY ${ACCELERANT_API_DOCS_DIR}/html/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/api OPTIONAL)
endif()
if(ACCELERANT_MAN_PAGE)
  install(FILES ${ACCELERANT_MAN_PAGE} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
endif()
# What Debian expects in every package's doc folder: the copyright and a compressed changelog.
install(FILES ${PROJECT_SOURCE_DIR}/cmake/debian/copyright DESTINATION ${CMAKE_INSTALL_DOCDIR})
execute_process(COMMAND gzip -9n -c ${PROJECT_SOURCE_DIR}/cmake/debian/changelog
                OUTPUT_FILE ${PROJECT_BINARY_DIR}/changelog.gz)
install(FILES ${PROJECT_BINARY_DIR}/changelog.gz DESTINATION ${CMAKE_INSTALL_DOCDIR})
