#include "controller/core/model.hpp"
#include <caf/all.hpp>
