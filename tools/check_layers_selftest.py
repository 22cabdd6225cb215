#!/usr/bin/env python3
"""Self-test of tools/check_layers.py over the small fake source trees under
tests/tools/layering_fixture/: each tree is run as a SOURCE_DIR of its own,
and the checker must exit 1 naming exactly the known offending includes (by
file:line and include), or 0 on the clean tree.

  clean/             every kind of include the rules admit (quoted, angled,
                     relative, <troupe/...> as the public ABI, third-party
                     headers where they are allowed)
  quoted_forbidden/  controller/ includes "proxy/proxy.hpp"
  angled_project/    proxy/ includes <controller/core/model.hpp>
  caf_in_core/       controller/core/ includes <caf/all.hpp>
  config_and_abi/    config/ includes "controller/controller.hpp" (more than
                     the controller's model); include/ includes <caf/all.hpp>
  shell_actor/       controller/shell/ includes "controller/controller_actor.hpp"

(In the real tree these files are under tests/, a room that may include
anything, so layers_include_rules stays green.)

Usage: check_layers_selftest.py [SOURCE_DIR]. Exits 0 when every case holds.
"""

import os
import re
import subprocess
import sys

# Case -> the offending includes the checker must name ("file:line: #include X"),
# none for a clean tree.
CASES = {
    "clean": [],
    "quoted_forbidden": ['controller/controller.cpp:3: #include "proxy/proxy.hpp"'],
    "angled_project": ["proxy/router.cpp:3: #include <controller/core/model.hpp>"],
    "caf_in_core": ["controller/core/model.cpp:2: #include <caf/all.hpp>"],
    "config_and_abi": ['config/config.cpp:2: #include "controller/controller.hpp"',
                       "include/troupe/deployment.hpp:2: #include <caf/all.hpp>"],
    "shell_actor": ['controller/shell/controller_logic.hpp:3: '
                    '#include "controller/controller_actor.hpp"'],
}
PROBLEM = re.compile(r"^(\S+:\d+: #include \S+): ")


def main():
    source_dir = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                                 os.path.join(os.path.dirname(__file__), ".."))
    checker = os.path.join(source_dir, "tools", "check_layers.py")
    fixtures = os.path.join(source_dir, "tests", "tools", "layering_fixture")
    failures = []
    for case, expected in CASES.items():
        run = subprocess.run([sys.executable, checker, os.path.join(fixtures, case)],
                             capture_output=True, text=True)
        named = [m.group(1) for m in map(PROBLEM.match, run.stdout.splitlines()) if m]
        want_rc = 1 if expected else 0
        if run.returncode != want_rc or sorted(named) != sorted(expected):
            failures.append(f"{case}: expected exit {want_rc} naming {expected or 'nothing'}; "
                            f"got exit {run.returncode} naming {named or 'nothing'}\n"
                            f"--- output:\n{run.stdout}{run.stderr}---")
        else:
            print(f"{case}: exit {run.returncode}, {len(named)} offending include(s) named")
    for f in failures:
        print(f)
    if failures:
        print(f"{len(failures)} of {len(CASES)} case(s) failed")
        return 1
    print(f"all {len(CASES)} cases hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
