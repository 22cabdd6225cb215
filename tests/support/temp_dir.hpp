// The one temporary directory of the tests: /tmp/<prefix>-XXXXXX, removed
// with everything in it when it goes out of scope (unless keep() was called).
// Header-only (tools/common/temp_dir.hpp, which the chaos tool uses too), so
// a unit test uses it without linking troupe_test_support or troupe_process.
#pragma once

#include "tools/common/temp_dir.hpp"

namespace troupe::testing {

using proc::TempDir;

}  // namespace troupe::testing
