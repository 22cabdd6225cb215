# troupe_config: the YAML config file of `troupectl deploy` (parse, validate,
# print back). Plain C++, no CAF: troupectl and tests/config link it.
# parse_import_path comes from troupe_plugin, so the config and the plugin
# loader agree on what an import path is.
add_library(troupe_config STATIC ${PROJECT_SOURCE_DIR}/tools/troupectl/config.cpp)
target_include_directories(troupe_config PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(troupe_config PUBLIC
  troupe_controller_core
  troupe_plugin
  yaml-cpp
  nlohmann_json::nlohmann_json)
