#pragma once
#include <caf/all.hpp>
#include <nlohmann/json.hpp>
