# The design card's dependencies, each found the way its Debian package ships it.
find_package(PkgConfig REQUIRED)
find_package(MPI REQUIRED COMPONENTS CXX)
pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
find_package(tomlplusplus 3 REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 REQUIRED)
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_package(Threads REQUIRED)
# OpenSSL: HMAC-SHA-256 for the network front door's challenge-response.
find_package(OpenSSL REQUIRED COMPONENTS Crypto)

# METIS ships neither a CMake nor a pkg-config file.
find_path(METIS_INCLUDE_DIR metis.h REQUIRED)
find_library(METIS_LIBRARY metis REQUIRED)
add_library(moed::metis INTERFACE IMPORTED)
target_include_directories(moed::metis INTERFACE ${METIS_INCLUDE_DIR})
target_link_libraries(moed::metis INTERFACE ${METIS_LIBRARY})

# OpenBLAS's cblas.h lives under an alternatives-managed include dir on Debian.
find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-pthread openblas REQUIRED)
add_library(moed::blas INTERFACE IMPORTED)
target_include_directories(moed::blas INTERFACE ${CBLAS_INCLUDE_DIR})
target_link_libraries(moed::blas INTERFACE BLAS::BLAS)

# CUDA: AUTO builds the GPU kernels when a CUDA compiler is found.
set(MOED_HAVE_CUDA OFF)
if(NOT MOED_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    # NCCL has no CMake module; it sits beside the toolkit.
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib)
    set(MOED_HAVE_CUDA ON)
  elseif(MOED_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MOED_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "moed: CUDA kernels ${MOED_HAVE_CUDA}")

find_package(GTest REQUIRED)
