#include "controller/core/model.hpp"
#include "controller/controller.hpp"
