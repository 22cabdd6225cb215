#include <vector>
#include "runtime/status.hpp"
#include "proxy/proxy.hpp"
