#include <caf/all.hpp>
#include <controller/core/model.hpp>
#include "runtime/wire.hpp"
