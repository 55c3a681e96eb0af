# LibTorch for compute/: the CUDA-enabled LibTorch inside PyPI's `torch` wheel first,
# Debian's CPU-only libtorch-dev as the fallback. Only compute/ links it.
set(LORADB_HAVE_TORCH OFF)
if(NOT LORADB_TORCH STREQUAL "OFF" AND LORADB_SANITIZE STREQUAL "")
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _torch_rc ERROR_QUIET)
    if(_torch_rc EQUAL 0 AND EXISTS "${_torch_prefix}")
      list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
    endif()
  endif()
  if(LORADB_HAVE_CUDA)
    # Caffe2's cuda.cmake still links CUDA::nvToolsExt, which CUDA 12.9+/13 no longer ship:
    # give it the header-only NVTX3 target under the old name.
    find_package(CUDAToolkit REQUIRED)
    if(NOT TARGET CUDA::nvToolsExt AND TARGET CUDA::nvtx3)
      add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
      target_link_libraries(CUDA::nvToolsExt INTERFACE CUDA::nvtx3)
    endif()
  else()
    # Without nvcc, do not let a CUDA-enabled LibTorch go looking for a toolkit.
    set(USE_CUDA OFF)
  endif()
  find_package(Torch QUIET)
  if(Torch_FOUND)
    set(LORADB_HAVE_TORCH ON)
    # PyPI's CUDA LibTorch needs the NCCL wheel's libnccl (found at run time through its RPATH);
    # at link time a system libnccl under the CUDA toolkit may shadow it with missing symbols.
    get_filename_component(_nccl_dir "${TORCH_INSTALL_PREFIX}/../nvidia/nccl/lib" ABSOLUTE)
    if(EXISTS "${_nccl_dir}")
      list(APPEND TORCH_LIBRARIES "-Wl,-rpath-link,${_nccl_dir}")
    endif()
    message(STATUS "loradb: LibTorch ${Torch_VERSION} from ${Torch_DIR}")
  elseif(LORADB_TORCH STREQUAL "ON")
    message(FATAL_ERROR "LORADB_TORCH=ON but LibTorch was not found (run tools/dev setup)")
  else()
    message(STATUS "loradb: LibTorch not found; compute/ is not built")
  endif()
endif()
