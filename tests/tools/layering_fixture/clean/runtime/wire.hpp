#pragma once
#include <caf/all.hpp>
#include "runtime/status.hpp"
#include "schemas/wire.capnp.h"
