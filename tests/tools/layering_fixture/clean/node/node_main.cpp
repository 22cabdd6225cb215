#include <caf/all.hpp>
#include <config/config.hpp>
#include "controller/controller.hpp"
#include <proxy/proxy.hpp>
