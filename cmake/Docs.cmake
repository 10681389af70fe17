# The API reference from the public headers: `cmake --build build --target docs` (make docs) writes
# <build>/docs/api/html with doxygen, which cmake/Install.cmake then installs beside the other docs.
# Warnings are printed but do not stop this target; the ctest `api_docs` is the check that fails on
# them (tests/CMakeLists.txt).
set(ACCELERANT_API_DOCS_DIR ${PROJECT_BINARY_DIR}/docs/api)
set(ACCELERANT_DOXYFILE ${PROJECT_BINARY_DIR}/docs/Doxyfile)
configure_file(${PROJECT_SOURCE_DIR}/cmake/Doxyfile.in ${ACCELERANT_DOXYFILE} @ONLY)

find_package(Doxygen QUIET)
if(DOXYGEN_FOUND)
  add_custom_target(docs
    COMMAND ${CMAKE_COMMAND} -E make_directory ${ACCELERANT_API_DOCS_DIR}
    COMMAND Doxygen::doxygen ${ACCELERANT_DOXYFILE}
    COMMAND ${CMAKE_COMMAND} -E echo "API reference: ${ACCELERANT_API_DOCS_DIR}/html/index.html"
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
    COMMENT "Generating the API reference with doxygen"
    VERBATIM)
else()
  add_custom_target(docs
    COMMAND ${CMAKE_COMMAND} -E echo "docs: doxygen was not found when CMake configured;"
            "install it (scripts/install-deps, or apt-get install doxygen) and configure again"
    COMMAND ${CMAKE_COMMAND} -E false
    VERBATIM)
endif()
