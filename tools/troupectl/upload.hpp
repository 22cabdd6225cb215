// `troupectl deploy` of a config that names libraries on the operator's
// machine (`import_path: ./build/libmodels.so:Model`, relative to the config
// file): each is checked, hashed and uploaded to the controller before the
// config is sent (issue 21; runtime/libraries.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "controller/core/model.hpp"
#include "runtime/status.hpp"

namespace troupe::ctl {

struct LocalLibrary {
  std::string path;  // canonical
  std::string sha256;
  std::string bytes;
};

// Finds the libraries of `state` given by a path, resolves each against the
// directory of `config_file`, and checks it before anything is sent: inside
// the config's directory tree, a regular file of at most
// libraries::kMaxLibraryBytes, an ELF shared object of this machine, and
// exporting each deployment class named from it, built against this
// troupectl's deployment ABI (checked by loading it in a child process, so a
// library that crashes while loading ends that child only). Sets each such
// deployment's library_sha256. The error is one line naming the config,
// the deployment and the problem.
Result<std::vector<LocalLibrary>> prepare_uploads(controller::TargetState& state,
                                                  const std::string& config_file);

// Sends one piece of a library: (sha256, total, offset, bytes) -> the bytes
// the controller holds so far.
using SendPiece = std::function<Result<uint64_t>(const std::string& sha256, uint64_t total,
                                                 uint64_t offset, const std::string& piece)>;

// Uploads `library` in pieces of libraries::kChunkBytes, unless `held` (what
// the controller says it has of it) is already its size.
Status upload(const LocalLibrary& library, uint64_t held, const SendPiece& send);

}  // namespace troupe::ctl
