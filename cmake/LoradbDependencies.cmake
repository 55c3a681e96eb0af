# Third-party dependencies, each found through its own CMake config or pkg-config.
# `tools/dev setup` installs all of them from Debian's packages.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(absl REQUIRED)
find_package(FlatBuffers REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(simdjson REQUIRED)
find_package(CLI11 REQUIRED)
pkg_check_modules(LMDB REQUIRED IMPORTED_TARGET lmdb)
pkg_check_modules(LIBURING REQUIRED IMPORTED_TARGET liburing)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
# Boost.Beast (header-only) parses HTTP requests in api/http; no compiled Boost library is used.
find_package(Boost 1.74 REQUIRED)
if(LORADB_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(LORADB_BUILD_BENCH)
  find_package(benchmark QUIET)
endif()

# flatc: generate C++ headers for schema files into the build tree.
find_program(FLATC_EXECUTABLE flatc REQUIRED)
function(loradb_flatbuffers_generate target)
  set(outputs)
  foreach(fbs IN LISTS ARGN)
    get_filename_component(name ${fbs} NAME_WE)
    set(out ${CMAKE_CURRENT_BINARY_DIR}/${name}_generated.h)
    add_custom_command(
      OUTPUT ${out}
      COMMAND ${FLATC_EXECUTABLE} --cpp --scoped-enums
              -o ${CMAKE_CURRENT_BINARY_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/${fbs}
      DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${fbs}
      COMMENT "flatc ${fbs}")
    list(APPEND outputs ${out})
  endforeach()
  add_custom_target(${target}_gen DEPENDS ${outputs})
  add_library(${target} INTERFACE)
  add_dependencies(${target} ${target}_gen)
  target_include_directories(${target} INTERFACE ${CMAKE_BINARY_DIR})
  target_link_libraries(${target} INTERFACE flatbuffers::flatbuffers_shared)
endfunction()
