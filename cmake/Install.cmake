# What `cmake --install` puts under the prefix (/opt/moed unless told
# otherwise), in the layout launch/README.md and docs/install.md describe:
#
#   bin/        moed, moectl, moe-place; moed-mpirun (a link to launch/)
#   lib/        libmoed_client.so (the front door's client library)
#   include/    client/: moed_client.h (the library's C ABI), client.h (C++)
#   python/     moed_client.py (the ctypes client over that ABI)
#   launch/     moed-mpirun, moed-rank, moed.sbatch, emulated-cluster, README.md
#   configs/    the shipped configs (demo, benchmarks)
#
# The rules are kept here, in one place, rather than in each part's folder.

# A self-contained tree: launch/ and configs/ sit beside bin/, so the prefix is
# the package's own directory, not /usr/local.
if(CMAKE_INSTALL_PREFIX_INITIALIZED_TO_DEFAULT)
  set(CMAKE_INSTALL_PREFIX /opt/moed CACHE PATH "Where `cmake --install` puts moed" FORCE)
endif()

set(moed_programs moed moectl moe-place)

# Installed binaries find libmoed_client in the install's lib/, wherever the
# tree is; the install rewrites the build tree's RPATH, so none points there.
set_target_properties(${moed_programs} PROPERTIES INSTALL_RPATH "$ORIGIN/../lib")

install(TARGETS ${moed_programs} RUNTIME DESTINATION bin)
install(TARGETS moed_client LIBRARY DESTINATION lib)
# The C ABI (moed_client.h) and the C++ API (client.h, which includes
# protocol.h), kept under client/ so that #include "client/client.h" works as
# in the source tree with -IPREFIX/include.
install(FILES
  ${PROJECT_SOURCE_DIR}/client/moed_client.h
  ${PROJECT_SOURCE_DIR}/client/client.h
  ${PROJECT_SOURCE_DIR}/client/protocol.h
  DESTINATION include/client)
install(FILES ${PROJECT_SOURCE_DIR}/client/python/moed_client.py DESTINATION python)

install(PROGRAMS
  ${PROJECT_SOURCE_DIR}/launch/moed-mpirun
  ${PROJECT_SOURCE_DIR}/launch/moed-rank
  ${PROJECT_SOURCE_DIR}/launch/moed.sbatch
  ${PROJECT_SOURCE_DIR}/launch/emulated-cluster
  DESTINATION launch)
install(FILES ${PROJECT_SOURCE_DIR}/launch/README.md DESTINATION launch)
# bin/moed-mpirun for PATH; the launcher resolves the link and finds moed-rank
# beside itself and moed in ../bin.
file(MAKE_DIRECTORY ${PROJECT_BINARY_DIR}/install)
file(CREATE_LINK ../launch/moed-mpirun ${PROJECT_BINARY_DIR}/install/moed-mpirun SYMBOLIC)
install(FILES ${PROJECT_BINARY_DIR}/install/moed-mpirun DESTINATION bin)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/configs/ DESTINATION configs FILES_MATCHING PATTERN "*.toml")
