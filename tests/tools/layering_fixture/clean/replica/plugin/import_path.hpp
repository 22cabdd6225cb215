#pragma once
#include <troupe/deployment.hpp>
