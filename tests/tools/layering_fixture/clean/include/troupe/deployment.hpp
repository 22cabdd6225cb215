#pragma once
#include <string>
#include <nlohmann/json.hpp>
