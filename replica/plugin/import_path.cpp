#include "replica/plugin/import_path.hpp"

#include <string>

#include "runtime/printable.hpp"

namespace troupe {

namespace {

constexpr const char* kExpected = "expected '<library>:<ClassName>', e.g. 'libfoo.so:Hello'";

bool is_alpha_or_underscore(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

}  // namespace

bool is_c_identifier(const std::string& name) {
  if (name.empty() || !is_alpha_or_underscore(name[0]))
    return false;
  for (char c : name) {
    if (!is_alpha_or_underscore(c) && !(c >= '0' && c <= '9'))
      return false;
  }
  return true;
}

Result<ImportPath> parse_import_path(const std::string& value) {
  const std::string quoted = "import_path '" + escape_control_characters(value) + "'";
  // A library name is a C string to dlopen: no NUL, nor any other control
  // character.
  if (has_control_character(value))
    return {errc::invalid_argument, quoted + " contains a control character"};
  auto colon = value.find(':');
  if (colon == std::string::npos) {
    return {errc::invalid_argument, quoted + " has no ':'; " + kExpected};
  }
  ImportPath path{value.substr(0, colon), value.substr(colon + 1)};
  if (path.library.empty()) {
    return {errc::invalid_argument, quoted + " has an empty library name; " + kExpected};
  }
  if (path.class_name.empty()) {
    return {errc::invalid_argument, quoted + " has an empty class name; " + kExpected};
  }
  if (!is_c_identifier(path.class_name)) {
    return {errc::invalid_argument, quoted + ": class name '" + path.class_name +
                                        "' is not a C identifier (letters, digits and '_', "
                                        "not starting with a digit)"};
  }
  return path;
}

}  // namespace troupe
