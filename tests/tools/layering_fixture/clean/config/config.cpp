#include <yaml-cpp/yaml.h>
#include "controller/core/model.hpp"
#include "replica/plugin/import_path.hpp"
#include <runtime/status.hpp>
