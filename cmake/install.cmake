# What `cmake --install` puts under the prefix, and the Debian package of it
# (docs/packaging.md). Only what users of troupe need: the node, troupectl,
# the public headers with the CMake package for plugin authors, the example
# deployments library, and the systemd units; no tests, fuzzers or benches.
#
#   <prefix>/bin/troupe-node, troupe-replica, troupectl
#   <prefix>/include/troupe/deployment.hpp, testing.hpp
#   <prefix>/lib/cmake/troupe/        find_package(troupe)
#   <prefix>/lib/troupe/plugins/libtroupe_examples.so
#   <prefix>/lib/troupe/troupe-wait-ready
#   <prefix>/lib/systemd/system/troupe-head.service, troupe-worker@.service
#   <prefix>/share/troupe/            env file templates, the demo config
include(CMakePackageConfigHelpers)

# troupe-node starts troupe-replica from its own directory: both in bin.
install(TARGETS troupe-node troupe-replica troupectl RUNTIME DESTINATION bin)

install(DIRECTORY include/troupe DESTINATION include FILES_MATCHING PATTERN "*.hpp")

install(TARGETS troupe_deployment EXPORT troupeTargets)
install(EXPORT troupeTargets NAMESPACE troupe:: DESTINATION lib/cmake/troupe)
configure_package_config_file(cmake/troupeConfig.cmake.in
  ${CMAKE_BINARY_DIR}/cmake/troupeConfig.cmake
  INSTALL_DESTINATION lib/cmake/troupe)
# A plugin must be built against the header of the node's release: the ABI
# version (kDeploymentAbiVersion) is checked at load time, and a plugin of
# another minor release may be refused.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/troupeConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${CMAKE_BINARY_DIR}/cmake/troupeConfig.cmake
              ${CMAKE_BINARY_DIR}/cmake/troupeConfigVersion.cmake
              cmake/troupeDeployment.cmake
        DESTINATION lib/cmake/troupe)

# The examples library, so that an installed node has something to deploy
# (share/troupe/demo.yaml); not the test-only troupe_bad_abi.
install(TARGETS troupe_examples LIBRARY DESTINATION lib/troupe/plugins)
install(FILES examples/demo.yaml DESTINATION share/troupe)

# The systemd units name absolute paths: those of the package's prefix.
set(TROUPE_PACKAGE_PREFIX /usr CACHE PATH "where the Debian package installs (the units' paths)")
foreach(unit troupe-head.service troupe-worker@.service)
  configure_file(packaging/systemd/${unit}.in ${CMAKE_BINARY_DIR}/packaging/${unit} @ONLY)
  install(FILES ${CMAKE_BINARY_DIR}/packaging/${unit} DESTINATION lib/systemd/system)
endforeach()
install(PROGRAMS packaging/troupe-wait-ready DESTINATION lib/troupe)
install(FILES packaging/head.env.example packaging/worker.env.example DESTINATION share/troupe)

# --- the Debian package: `cpack -G DEB` in the build dir ----------------------
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME troupe)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "troupe")
set(CPACK_PACKAGE_CONTACT "troupe maintainers <troupe@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "serving runtime for C++ deployments: node, troupectl, plugin SDK")
set(CPACK_PACKAGING_INSTALL_PREFIX ${TROUPE_PACKAGE_PREFIX})
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/package)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
# The libraries the binaries link (CAF, RocksDB, Cap'n Proto, ...), found by
# dpkg-shlibdeps (dpkg-dev); plugin authors also need a compiler, CMake and
# the JSON library the header uses.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "nlohmann-json3-dev")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "cmake, g++")
# Stripped: the debug info of a RelWithDebInfo build is 9/10 of the binaries
# (troupe-node: 185 MB unstripped); the build tree keeps it for gdb.
set(CPACK_STRIP_FILES ON)
# postinst: creates the system user troupe-replica (node/replica_user.hpp).
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/packaging/debian/postinst)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
