# Layers the compiler enforces (README "Layers"). Each folder of src/ is one layer; src/layers.txt
# lists them lowest first with the public headers each owns. Every layer compiles as its own
# object libraries whose include path is a folder made here, in the build tree, holding links to
# its own and the lower layers' folders and public headers, and nothing else: a file that includes
# a higher layer ("graph/metrics_recording.h", <accelerant/accelerator.h>) does not compile
# ("No such file or directory"). An executable per layer then links that layer's objects with the
# lower layers' only, so a call into a higher layer that dodged the includes (a declaration
# written by hand) fails to link. scripts/check-layers says the same with file and line, and
# checks what a compiler cannot see.

# accelerant_read_layers(TABLE): sets ACCELERANT_LAYERS (lowest first) and, for each layer L,
# ACCELERANT_PUBLIC_HEADERS_<L>; fails naming a public header the table does not place.
function(accelerant_read_layers table)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${table})
  file(STRINGS ${table} lines)
  set(layers "")
  set(current "")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "#.*" "" line "${line}")
    if(line MATCHES "^[ \t]*$")
      continue()
    endif()
    if(line MATCHES "^([a-z_]+):(.*)$")
      set(current ${CMAKE_MATCH_1})
      list(APPEND layers ${current})
      set(headers_${current} "")
      set(line "${CMAKE_MATCH_2}")
    elseif(NOT current OR NOT line MATCHES "^[ \t]")
      message(FATAL_ERROR "${table}: cannot read \"${line}\" (expected \"layer: header.h ...\" "
                          "or an indented continuation)")
    endif()
    separate_arguments(names UNIX_COMMAND "${line}")
    list(APPEND headers_${current} ${names})
    foreach(name IN LISTS names)
      set(layer_of_${name} ${current})
    endforeach()
  endforeach()
  # A new public header must be placed, or its layer's code could not include it.
  file(GLOB public CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}/include/accelerant
       ${PROJECT_SOURCE_DIR}/include/accelerant/*)
  foreach(name IN LISTS public)
    if(NOT DEFINED layer_of_${name})
      message(FATAL_ERROR "include/accelerant/${name} is in no layer. Fix: add it to its layer in "
                          "${table}.")
    endif()
  endforeach()
  set(ACCELERANT_LAYERS ${layers} PARENT_SCOPE)
  foreach(layer IN LISTS layers)
    set(ACCELERANT_PUBLIC_HEADERS_${layer} ${headers_${layer}} PARENT_SCOPE)
  endforeach()
endfunction()

# accelerant_layers_up_to(LAYER OUT): the layers LAYER may use, lowest first, LAYER last.
function(accelerant_layers_up_to layer out)
  list(FIND ACCELERANT_LAYERS ${layer} index)
  if(index LESS 0)
    message(FATAL_ERROR "accelerant_layers_up_to: '${layer}' is not a layer of src/layers.txt "
                        "(${ACCELERANT_LAYERS})")
  endif()
  list(SUBLIST ACCELERANT_LAYERS 0 ${index} lower)
  set(${out} ${lower} ${layer} PARENT_SCOPE)
endfunction()

# accelerant_layer_include_dir(LAYER OUT): makes (afresh at each configure, so that a removed
# header leaves no stale link) the folder LAYER's code includes from, and returns its path.
function(accelerant_layer_include_dir layer out)
  set(dir ${PROJECT_BINARY_DIR}/layers/${layer})
  file(REMOVE_RECURSE ${dir})
  file(MAKE_DIRECTORY ${dir}/accelerant)
  accelerant_layers_up_to(${layer} usable)
  foreach(lower IN LISTS usable)
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${lower} ${dir}/${lower} SYMBOLIC)
    foreach(header IN LISTS ACCELERANT_PUBLIC_HEADERS_${lower})
      # version.h is generated (cmake/version.h.in); the rest are in the source tree.
      set(from ${PROJECT_SOURCE_DIR}/include/accelerant/${header})
      if(header STREQUAL "version.h")
        set(from ${PROJECT_BINARY_DIR}/include/accelerant/version.h)
      endif()
      file(CREATE_LINK ${from} ${dir}/accelerant/${header} SYMBOLIC)
    endforeach()
  endforeach()
  set(${out} ${dir} PARENT_SCOPE)
endfunction()

# accelerant_add_layer(LAYER [CORE source...] [LIBTORCH source...]): the layer's object
# libraries. CORE sources compile without LibTorch (accelerant_<LAYER>_core_objects: the front end
# links those alone); LIBTORCH sources with it and the shared precompiled header
# (accelerant_<LAYER>_objects). Both see only the layer's include folder.
function(accelerant_add_layer layer)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "CORE;LIBTORCH")
  accelerant_layer_include_dir(${layer} include_dir)
  set(made "")
  if(arg_CORE)
    add_library(accelerant_${layer}_core_objects OBJECT ${arg_CORE})
    target_link_libraries(accelerant_${layer}_core_objects PRIVATE Threads::Threads yaml-cpp
                          nlohmann_json::nlohmann_json ZLIB::ZLIB)
    if(ACCELERANT_CUDA_LIBTORCH)
      # The launch banner says GPUs when the workers' LibTorch is a CUDA build and a device is there.
      target_compile_definitions(accelerant_${layer}_core_objects PRIVATE ACCELERANT_CUDA_LIBTORCH)
    endif()
    list(APPEND made accelerant_${layer}_core_objects)
  endif()
  if(arg_LIBTORCH)
    add_library(accelerant_${layer}_objects OBJECT ${arg_LIBTORCH})
    target_link_libraries(accelerant_${layer}_objects PRIVATE ${TORCH_LIBRARIES} Threads::Threads
                          nlohmann_json::nlohmann_json yaml-cpp ZLIB::ZLIB)
    if(TARGET gloo)
      target_link_libraries(accelerant_${layer}_objects PRIVATE gloo)
    endif()
    if(ACCELERANT_CUDA_LIBTORCH)
      # USE_C10D_NCCL: c10d's NCCL headers are usable only with a CUDA LibTorch (docs/building.md).
      # ACCELERANT_CUDA_GRAPHS: GraphStep captures CUDA graphs (ATen/cuda/CUDAGraph.h).
      target_compile_definitions(accelerant_${layer}_objects PRIVATE USE_C10D_NCCL ACCELERANT_CUDA_GRAPHS)
    endif()
    accelerant_use_pch(accelerant_${layer}_objects ${ACCELERANT_LIBRARY_PCH_TARGET})
    list(APPEND made accelerant_${layer}_objects)
  endif()
  foreach(target IN LISTS made)
    set_target_properties(${target} PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF
                                               UNITY_BUILD ${ACCELERANT_UNITY_BUILD})
    target_include_directories(${target} PRIVATE ${include_dir})
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  endforeach()
  set(ACCELERANT_LAYER_TARGETS_${layer} ${made} PARENT_SCOPE)
endfunction()

# accelerant_add_layer_link_checks(EXTRA_OBJECTS...): one executable per layer below the top,
# linking every object of that layer and the ones below it (objects named on a link line are all
# linked, unlike archive members), so that a reference into a higher layer is an undefined symbol.
# EXTRA_OBJECTS: objects that belong to a layer but are made apart (generated code), as
# LAYER=$<TARGET_OBJECTS:...> pairs.
function(accelerant_add_layer_link_checks)
  list(LENGTH ACCELERANT_LAYERS count)
  math(EXPR below_top "${count} - 2")
  foreach(index RANGE ${below_top})
    list(GET ACCELERANT_LAYERS ${index} layer)
    accelerant_layers_up_to(${layer} usable)
    set(objects "")
    foreach(lower IN LISTS usable)
      foreach(target IN LISTS ACCELERANT_LAYER_TARGETS_${lower})
        list(APPEND objects $<TARGET_OBJECTS:${target}>)
      endforeach()
      foreach(extra IN LISTS ARGN)
        if(extra MATCHES "^${lower}=(.*)$")
          list(APPEND objects ${CMAKE_MATCH_1})
        endif()
      endforeach()
    endforeach()
    set(check accelerant_${layer}_link_check)
    add_executable(${check} ${PROJECT_SOURCE_DIR}/cmake/layer_link_check.cpp ${objects})
    set_target_properties(${check} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/layers)
    target_link_libraries(${check} PRIVATE ${TORCH_LIBRARIES} Threads::Threads ${CMAKE_DL_LIBS}
                          yaml-cpp ZLIB::ZLIB ${Protobuf_LIBRARIES})
    if(TARGET gloo)
      target_link_libraries(${check} PRIVATE gloo)
    endif()
  endforeach()
endfunction()
