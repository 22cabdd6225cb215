#pragma once
#include "runtime/status.hpp"
