#include <string>
#include <runtime/wire.hpp>
#include <controller/core/model.hpp>
