#include <caf/all.hpp>
#include "node/node_main.hpp"
#include <tools/troupectl/main.hpp>
