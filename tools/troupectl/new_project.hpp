// `troupectl new NAME [--dir DIR]`: writes a starter project for a deployment
// library into DIR/NAME — a deployment class, a CMakeLists.txt that builds it
// with find_package(troupe) and troupe_add_deployment(), a config that
// deploys it, and a test that runs it in process with troupe/testing.hpp —
// which builds and passes as it is written (docs/packaging.md).
//
// Errors are one line each (errc::invalid_argument): a bad NAME, a DIR/NAME
// that exists and is not an empty directory, or a failed write. The project
// is written into a hidden directory next to DIR/NAME and renamed into place
// at the end, so a failure leaves nothing half-written.
#pragma once

#include <string>
#include <vector>

#include "runtime/status.hpp"

namespace CLI {
class App;
}

namespace troupe::ctl {

// NAME is the project's directory, CMake project and library target
// (lib<NAME>.so), and the application's name and route prefix (/<NAME>):
// a letter, then letters, digits, '_' or '-', at most 64 characters; not a
// name CMake keeps for itself (all, clean, help, install, package, test).
Status check_project_name(const std::string& name);

// The deployment class of project NAME: NAME in CamelCase, its parts split
// at '_' and '-' ("my_models" -> "MyModels", "hello" -> "Hello").
std::string project_class_name(const std::string& name);

struct StarterFile {
  std::string path;  // relative to the project's directory
  std::string text;
};

// The files of project NAME (a valid name).
std::vector<StarterFile> starter_files(const std::string& name);

// Writes the project NAME into DIR/NAME; returns that path.
Result<std::string> write_starter_project(const std::string& name, const std::string& dir);

// The subcommand in troupectl's command line; run_new_command() runs it when
// it was given (prints what it wrote, or the error) and returns the exit code.
struct NewCommand {
  CLI::App* command = nullptr;
  std::string name;
  std::string dir = ".";
};
void add_new_command(CLI::App& app, NewCommand& c);
int run_new_command(const NewCommand& c);

}  // namespace troupe::ctl
