# The Debian package: `cd build && cpack -G DEB` gives moed_<version>_amd64.deb,
# which installs the tree of cmake/Install.cmake under /opt/moed.
set(CPACK_PACKAGE_NAME moed)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "moed developers")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "distributed runtime serving Mixture-of-Experts expert layers")
# CONCAT, not a list: set()'s separate strings would be joined with ';'.
string(CONCAT CPACK_PACKAGE_DESCRIPTION
  "moed runs one MPI rank per GPU, each holding a share of a model's MoE\n"
  "experts. It serves expert layers to model processes through a shared-memory\n"
  "front door (libmoed_client), places experts with METIS and migrates them live.\n"
  "Includes moectl (the admin client), moe-place (offline placement) and the\n"
  "mpirun and Slurm launchers.")
set(CPACK_PACKAGING_INSTALL_PREFIX /opt/moed)
# Stripped, as Debian ships binaries (the build tree keeps the debug info).
set(CPACK_STRIP_FILES ON)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # moed_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "moed developers <dev@moed.invalid>")
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# The shared libraries' packages (Open MPI, UCX, hwloc, METIS, OpenBLAS,
# spdlog, ...) come from dpkg-shlibdeps; mpirun, which the launchers run,
# is not a library, so it is named.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "openmpi-bin")
# moed-rank binds with hwloc-bind, else numactl.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "hwloc, numactl")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "slurm-wlm, python3-numpy")

include(CPack)
