#!/usr/bin/env python3
"""Checks the layering of troupe's source tree over its #include lines.

The rooms, from the bottom up (docs/architecture.md, "Layers"):

  include/troupe  the public ABI of deployment libraries: nothing of troupe
  schemas/        Cap'n Proto schemas of durable and wire data
  runtime/        the base: status, errors, resources, address, log, wire types
                  and atoms, CAF setup, security, the data channel
  controller/     components: each may use runtime/ and schemas/ (and the
  replica/        public ABI), never another component, config/, node/ or
  proxy/          tools/. controller/core/ is the pure decision core: it uses
                  only itself and the plain-C++ headers of runtime/.
  config/         the YAML config library: the controller's model
                  (controller/core/model.hpp, validate.hpp), the replica's
                  import paths (replica/plugin/import_path.hpp) and runtime/
  node/           troupe-node: composes the components
  tools/          troupectl, chaos, benchmarks: on top of everything
  tests/, examples/  users of the rooms above (examples: the public ABI only)

Both forms of include are read:

  #include "..."  resolved against the source dir, else next to the including
                  file, else judged by its name if it names a room;
  #include <...>  judged when its path names a room (<runtime/wire.hpp>,
                  <controller/core/model.hpp>) or a file of include/
                  (<troupe/deployment.hpp> is include/troupe/deployment.hpp);
                  any other angled path (<vector>, <caf/all.hpp>) is not the
                  project's and passes, unless the next list forbids it.

Third-party headers a room may not include, in either form (a prefix "caf"
forbids caf/..., and "asio" forbids asio/... and asio.hpp):

  controller/core  caf, capnp, kj, rocksdb, boost (asio, beast), asio, spdlog,
                   CLI: the plain decision core links no CAF, no storage, no
                   network, logging or command-line library
  controller/ha    caf, rocksdb, spdlog: the election and the etcd client
                   are plain C++ driven by the head (Boost.Beast for HTTP)
  include          caf, capnp, kj, rocksdb: the public ABI a deployment
                   library compiles against carries none of troupe's
                   dependencies but the JSON one

The lines are read as lines: an #include inside a block comment or a raw
string counts too.

Usage: check_layers.py [SOURCE_DIR]. Prints one line per offending include
(file:line, the include, the rule it breaks) and exits 1 when there is any.
Self-test: tools/check_layers_selftest.py.
"""

import os
import re
import sys

# Room -> the rooms (directories or single files) it may include. The longest
# matching room applies.
ALLOWED = {
    "include": {"include"},
    "schemas": {"schemas"},
    "runtime": {"runtime", "schemas"},
    # The plain-C++ part of runtime/ (troupe_common): no CAF, no logging.
    "controller/core": {"controller/core", "runtime/address.hpp", "runtime/printable.hpp",
                        "runtime/resources.hpp", "runtime/status.hpp", "runtime/time.hpp"},
    "controller": {"controller", "runtime", "schemas", "include"},
    # The controller's plain shell: its parts, the core, membership, the
    # store's codec and the options; never the actor (controller_actor.hpp)
    # that wraps it.
    "controller/shell": {"controller/shell", "controller/core", "controller/membership.hpp",
                         "controller/store", "controller/controller_options.hpp", "runtime",
                         "schemas", "include"},
    # The highly available head's plain parts (election, etcd client, the
    # checkpoint in etcd): the core, the store's codec and the plain-C++
    # headers of runtime/; never the actor, the shell or CAF.
    "controller/ha": {"controller/ha", "controller/core", "controller/store/codec.hpp",
                      "runtime/status.hpp"},
    "replica": {"replica", "runtime", "schemas", "include"},
    "proxy": {"proxy", "runtime", "schemas", "include"},
    "config": {"config", "controller/core/model.hpp", "controller/core/validate.hpp",
               "replica/plugin/import_path.hpp", "runtime"},
    "node": {"node", "controller", "replica", "proxy", "config", "runtime", "schemas", "include"},
    "tools": {"tools", "node", "config", "controller", "replica", "proxy", "runtime", "schemas",
              "include"},
    "examples": {"examples", "include"},
    "tests": None,  # anything
}
# Room -> third-party header prefixes it may not include. The longest matching
# room applies (controller/ itself may use CAF; controller/core/ may not).
FORBIDDEN_THIRD_PARTY = {
    "controller/core": ("caf", "capnp", "kj", "rocksdb", "boost", "asio", "spdlog", "CLI"),
    "include": ("caf", "capnp", "kj", "rocksdb"),
    "controller/ha": ("caf", "rocksdb", "spdlog"),
}
ROOMS = sorted(ALLOWED, key=len, reverse=True)
SOURCE_EXTENSIONS = (".cpp", ".hpp", ".h", ".cc")
SKIP_DIRS = {".git", "build", "docs"}
INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<([^>]+)>)')


def room_of(path):
    """The room of a path relative to the source dir, or None."""
    for room in ROOMS:
        if path == room or path.startswith(room + "/"):
            return room
    return None


def resolve(source_dir, including_file, included):
    """A quoted include relative to the source dir: the tree's own paths are
    relative to it; anything else is resolved next to the including file."""
    if room_of(included) is not None and os.path.exists(os.path.join(source_dir, included)):
        return included
    if included.startswith("schemas/"):
        return included  # generated headers (schemas/*.capnp.h) live in the build dir
    local = os.path.normpath(os.path.join(os.path.dirname(including_file), included))
    if os.path.exists(os.path.join(source_dir, local)):
        return local
    return included  # not a file of the tree: judged by its name, if it names a room


def resolve_angled(source_dir, included):
    """An angled include relative to the source dir: a room's path as it is,
    a file of the public ABI (<troupe/...>) under include/; anything else is
    not the project's and is returned as it is (room_of gives None)."""
    if room_of(included) is not None:
        return included
    public = os.path.join("include", included)
    if os.path.isfile(os.path.join(source_dir, public)):
        return public
    return included


def allowed(from_room, target):
    rule = ALLOWED[from_room]
    if rule is None or room_of(target) is None:
        return True
    return any(target == r or target.startswith(r + "/") for r in rule)


def forbidden_third_party(from_room, included):
    """The forbidden prefix the include matches, or None."""
    for prefix in FORBIDDEN_THIRD_PARTY.get(from_room, ()):
        if included == prefix or included.startswith((prefix + "/", prefix + ".")):
            return prefix
    return None


def check_file(source_dir, rel, from_room):
    problems = []
    with open(os.path.join(source_dir, rel), encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            if m.group(1) is not None:
                included, shown = m.group(1), f'"{m.group(1)}"'
                target = resolve(source_dir, rel, included)
            else:
                included, shown = m.group(2), f"<{m.group(2)}>"
                target = resolve_angled(source_dir, included)
            where = f"{rel}:{number}: #include {shown}"
            prefix = forbidden_third_party(from_room, included)
            if prefix is not None and room_of(target) is None:
                banned = ", ".join(p + "/" for p in FORBIDDEN_THIRD_PARTY[from_room])
                problems.append(f"{where}: {from_room}/ may not include third-party {prefix}/ "
                                f"headers (it may include none of: {banned})")
            elif not allowed(from_room, target):
                may = ", ".join(r if r.endswith(".hpp") else r + "/"
                                for r in sorted(ALLOWED[from_room]))
                problems.append(f"{where}: {from_room}/ may not include {target} "
                                f"(it may include: {may})")
    return problems


def main():
    source_dir = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                                 os.path.join(os.path.dirname(__file__), ".."))
    problems = []
    checked = 0
    for dirpath, dirnames, filenames in os.walk(source_dir):
        rel_dir = os.path.relpath(dirpath, source_dir)
        dirnames[:] = sorted(d for d in dirnames
                             if not (rel_dir == "." and (d in SKIP_DIRS or d.startswith("build"))))
        for name in sorted(filenames):
            if not name.endswith(SOURCE_EXTENSIONS):
                continue
            rel = os.path.normpath(os.path.join(rel_dir, name))
            from_room = room_of(rel)
            if from_room is None:
                continue
            checked += 1
            problems += check_file(source_dir, rel, from_room)
    for p in problems:
        print(p)
    if checked == 0:
        print(f"no source files found under {source_dir}")
        return 1
    if problems:
        print(f"{len(problems)} include(s) break the layering (rules: tools/check_layers.py)")
        return 1
    print(f"{checked} files: the layering holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
