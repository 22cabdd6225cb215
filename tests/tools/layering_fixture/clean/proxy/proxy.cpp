#include "proxy_helpers.hpp"
#include <runtime/wire.hpp>
#include <boost/asio.hpp>
