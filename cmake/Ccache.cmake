# ccache in front of the compiler, configured so that it also caches translation units built with
# the precompiled LibTorch header (see docs/building.md: "Why the build is fast").
find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      CCACHE_BASEDIR=${PROJECT_SOURCE_DIR} ${CCACHE_PROGRAM})
  set(ACCELERANT_PCH_FLAGS -fpch-preprocess)
endif()
