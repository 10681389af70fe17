# ccache in front of the compiler, configured so that it also caches translation units built with
# the precompiled LibTorch header (see docs/building.md: "Why the build is fast").
# CCACHE_INODECACHE: ccache hashes every file a translation unit includes, the precompiled header
# too (about 550 MB), and without this it hashed that file again for each of the ~100 translation
# units that load it: 2.7 s each, about 6.7 s more per compile on an empty cache (21.2 s against
# 14.5 s without ccache) and 3.5 s per hit. With it, a file's hash is kept by device, inode and
# times, and computed once (bench/notes/build-goals.md).
find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      CCACHE_BASEDIR=${PROJECT_SOURCE_DIR} CCACHE_INODECACHE=true ${CCACHE_PROGRAM})
  set(ACCELERANT_PCH_FLAGS -fpch-preprocess)
endif()
