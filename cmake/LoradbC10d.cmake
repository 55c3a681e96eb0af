# torch.distributed (c10d) for compute/distributed/: the LibTorch found by LoradbTorch.cmake must
# export c10d with Gloo (the pip wheel does; Debian's libtorch-dev may not), and Gloo's headers
# must be installed (the wheel does not ship them: Debian's libgloo-dev, headers only — the
# symbols come from libtorch_cpu). Sets LORADB_HAVE_C10D and, with a CUDA LibTorch and nccl.h,
# LORADB_HAVE_NCCL. loradb_c10d_configure(TARGET) adds the include paths and definitions.
set(LORADB_C10D "AUTO" CACHE STRING "Build compute/distributed against c10d (AUTO|ON|OFF)")
set(LORADB_HAVE_C10D OFF)
set(LORADB_HAVE_NCCL OFF)
set(LORADB_C10D_REASON "")
if(LORADB_C10D STREQUAL "OFF")
  set(LORADB_C10D_REASON "LORADB_C10D=OFF")
else()
  find_path(LORADB_C10D_INCLUDE_DIR torch/csrc/distributed/c10d/ProcessGroupGloo.hpp
            PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
  find_path(LORADB_GLOO_INCLUDE_DIR gloo/rendezvous/store.h)
  if(NOT LORADB_C10D_INCLUDE_DIR)
    set(LORADB_C10D_REASON "LibTorch has no c10d headers")
  elseif(NOT LORADB_GLOO_INCLUDE_DIR)
    set(LORADB_C10D_REASON "Gloo headers missing (apt-get install libgloo-dev)")
  else()
    # Does the library export ProcessGroupGloo? Link a tiny program (cached after the first run).
    find_library(LORADB_TORCH_CPU_LIB torch_cpu PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH)
    find_library(LORADB_C10_LIB c10 PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH)
    if(NOT DEFINED LORADB_C10D_LINKS AND LORADB_TORCH_CPU_LIB AND LORADB_C10_LIB)
      include(CheckCXXSourceCompiles)
      set(CMAKE_REQUIRED_INCLUDES ${TORCH_INCLUDE_DIRS} ${LORADB_GLOO_INCLUDE_DIR})
      set(CMAKE_REQUIRED_DEFINITIONS -DUSE_DISTRIBUTED -DUSE_C10D_GLOO)
      # The library files, not the imported targets (their link interface needs find_package
      # context that a try-compile lacks).
      set(CMAKE_REQUIRED_LIBRARIES ${LORADB_TORCH_CPU_LIB} ${LORADB_C10_LIB}
                                   -Wl,--allow-shlib-undefined)
      set(CMAKE_REQUIRED_QUIET ON)
      check_cxx_source_compiles("
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
int main() { auto d = c10d::ProcessGroupGloo::createDefaultDevice(); return d ? 0 : 1; }"
                                LORADB_C10D_LINKS)
      unset(CMAKE_REQUIRED_INCLUDES)
      unset(CMAKE_REQUIRED_DEFINITIONS)
      unset(CMAKE_REQUIRED_LIBRARIES)
      unset(CMAKE_REQUIRED_QUIET)
    endif()
    if(LORADB_C10D_LINKS)
      set(LORADB_HAVE_C10D ON)
    else()
      set(LORADB_C10D_REASON "LibTorch does not export ProcessGroupGloo")
    endif()
  endif()
  if(LORADB_HAVE_C10D AND TARGET torch_cuda)
    find_path(LORADB_NCCL_INCLUDE_DIR nccl.h
              HINTS "${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include" ${CUDAToolkit_INCLUDE_DIRS})
    if(LORADB_NCCL_INCLUDE_DIR)
      set(LORADB_HAVE_NCCL ON)
    endif()
  endif()
  if(LORADB_C10D STREQUAL "ON" AND NOT LORADB_HAVE_C10D)
    message(FATAL_ERROR "LORADB_C10D=ON but: ${LORADB_C10D_REASON}")
  endif()
endif()
message(STATUS "loradb: c10d=${LORADB_HAVE_C10D} nccl=${LORADB_HAVE_NCCL} ${LORADB_C10D_REASON}")

# Only the files under compute/distributed/ see c10d (the rest of compute/ keeps its flags, and
# so its ccache hits); callers ask dist::C10dAvailable() at run time.
function(loradb_c10d_configure target)
  file(GLOB _dist_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/compute/distributed/*.cc)
  if(NOT _dist_sources)
    return()
  endif()
  if(LORADB_HAVE_C10D)
    set(_defs LORADB_HAVE_C10D=1 USE_DISTRIBUTED USE_C10D_GLOO)
    set(_incs "")
    if(NOT LORADB_GLOO_INCLUDE_DIR STREQUAL "/usr/include")  # never -isystem /usr/include
      list(APPEND _incs ${LORADB_GLOO_INCLUDE_DIR})
    endif()
    if(LORADB_HAVE_NCCL)
      list(APPEND _defs LORADB_HAVE_NCCL=1 USE_C10D_NCCL)
      list(APPEND _incs ${LORADB_NCCL_INCLUDE_DIR})
    endif()
  else()
    set(_defs "LORADB_C10D_MISSING_REASON=\"${LORADB_C10D_REASON}\"")
    set(_incs "")
  endif()
  set_source_files_properties(${_dist_sources} TARGET_DIRECTORY ${target} PROPERTIES
                              COMPILE_DEFINITIONS "${_defs}" INCLUDE_DIRECTORIES "${_incs}")
endfunction()
