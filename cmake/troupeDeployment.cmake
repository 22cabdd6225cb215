# troupe_add_deployment(): builds a deployment library the way troupe-node
# loads it. Included by troupe's own build (examples/) and by the installed
# CMake package (troupeConfig.cmake), so the flags of the in-tree examples and
# of users' plugins are the same file.
#
#   find_package(troupe REQUIRED)
#   troupe_add_deployment(my_models hello.cpp other.cpp)
#       -> libmy_models.so, named in a config as libmy_models.so:Hello
#
#   troupe_add_deployment(<target> [OUTPUT_DIRECTORY <dir>] <source>...)
#
# What it sets, and why:
#   - a MODULE library named lib<target>.so: troupe-node dlopen()s it, nothing
#     links to it;
#   - hidden visibility (classes and inline functions too): only what
#     TROUPE_DEPLOYMENT exports is visible, so two plugins loaded by one node
#     never resolve each other's symbols;
#   - -Wl,--no-undefined: every symbol must resolve at link time; a plugin
#     may not rely on the node that loads it (a missing library fails the
#     build here, not the replica at start);
#   - the target troupe::deployment: include/troupe/*.hpp, nlohmann_json (its
#     Json objects cross the boundary: the node and the plugin must use the
#     same one) and Threads.
# OUTPUT_DIRECTORY: where the library is built (default: the current binary
# dir); point a node's --plugin-path at it.
function(troupe_add_deployment target)
  cmake_parse_arguments(PARSE_ARGV 1 TROUPE "" "OUTPUT_DIRECTORY" "")
  if(NOT TROUPE_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "troupe_add_deployment(${target}): no source files")
  endif()
  if(NOT TARGET troupe::deployment)
    message(FATAL_ERROR "troupe_add_deployment(${target}): no target troupe::deployment; "
                        "call find_package(troupe REQUIRED) first")
  endif()
  add_library(${target} MODULE ${TROUPE_UNPARSED_ARGUMENTS})
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(TROUPE_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${TROUPE_OUTPUT_DIRECTORY})
  endif()
  target_compile_features(${target} PRIVATE cxx_std_17)
  target_link_libraries(${target} PRIVATE troupe::deployment)
  target_link_options(${target} PRIVATE -Wl,--no-undefined)
endfunction()
