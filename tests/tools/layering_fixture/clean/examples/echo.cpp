#include <troupe/deployment.hpp>
#include <vector>
