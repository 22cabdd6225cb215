#include "controller/core/model.hpp"
#include "model.hpp"
// #include <caf/all.hpp> is not read in a comment
#include <map>
