#pragma once
#include <vector>
#include "runtime/status.hpp"
#include <runtime/status.hpp>
