# GNU gold instead of the default BFD linker, when the toolchain has it (binutils ships it). Every
# test, example and bench links against LibTorch's large shared libraries and the static library;
# BFD takes several times as long as gold for each such link (docs/benchmarks.md, "Linking a
# program against LibTorch"). `make test` links about 70 programs, and each edit of the library
# relinks them all. -DACCELERANT_LINKER=bfd keeps the default linker.
set(ACCELERANT_LINKER gold CACHE STRING "Linker passed to the compiler as -fuse-ld= (gold, lld, bfd)")
set_property(CACHE ACCELERANT_LINKER PROPERTY STRINGS gold lld bfd)
if(NOT ACCELERANT_LINKER STREQUAL "bfd")
  include(CheckLinkerFlag)
  check_linker_flag(CXX -fuse-ld=${ACCELERANT_LINKER} ACCELERANT_HAS_LINKER_${ACCELERANT_LINKER})
  if(ACCELERANT_HAS_LINKER_${ACCELERANT_LINKER})
    add_link_options(-fuse-ld=${ACCELERANT_LINKER})
  else()
    message(STATUS "Linker ${ACCELERANT_LINKER} not usable here: linking with the compiler's default")
  endif()
endif()
