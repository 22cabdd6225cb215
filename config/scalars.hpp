// Internal to config/: the YAML 1.2 core schema's rules for plain scalars
// (what unquoted text reads as) and the text helpers of error messages and of
// the writer. Shared by the parser (parse.cpp, parse_values.cpp) and the
// writer (emit.cpp); not part of the public interface (config.hpp).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace troupe::config::detail {

// ---------------------------------------------------------------------------
// Text helpers.

// Levenshtein distance: insertions, deletions and substitutions of bytes.
size_t edit_distance(const std::string& a, const std::string& b);

// The items separated by ", ".
std::string join(const std::vector<std::string>& items);

// A user's text inside a one-line message: control characters escaped, long
// values shortened.
std::string printable(const std::string& s);

// printable(s) in single quotes.
std::string in_quotes(const std::string& s);

// What a node holds, for "got ..." in messages.
std::string describe(const YAML::Node& node);

// The shortest decimal text that reads back as exactly `v`.
std::string format_double(double v);

// ---------------------------------------------------------------------------
// Scalars: YAML 1.2 core schema resolution of plain scalars.

bool is_null_text(const std::string& s);   // "", ~, null, Null, NULL
bool is_true_text(const std::string& s);   // true, True, TRUE
bool is_false_text(const std::string& s);  // false, False, FALSE
// Booleans of YAML 1.1 (PyYAML, yaml-cpp's as<bool>): never written plain.
bool is_yaml11_bool_text(const std::string& s);
// Decimal integer text: [-+]?[0-9]+, of any length.
bool is_decimal_integer_text(const std::string& s);
// Any integer of the core schema: decimal, 0o octal or 0x hexadecimal.
bool is_integer_text(const std::string& s);
// Float syntax of the core schema ("1.5", "1e3", ".5"; integers match too).
bool is_float_text(const std::string& s);
// The core schema's infinities and NaNs (".inf", "-.Inf", ".nan").
bool is_special_float_text(const std::string& s);

// True when a plain (unquoted) scalar with this text would be read as
// something other than a string; such strings are written double-quoted.
bool needs_quotes(const std::string& s);

// Integer text as written in the config ("3", "-1", "+7"); nullopt when it is
// not a decimal integer or does not fit 64 bits.
std::optional<long long> parse_integer(const std::string& s);

// Float text of the core schema as a double; nullopt when it is not one or is
// too large for a double.
std::optional<double> parse_number(const std::string& s);

}  // namespace troupe::config::detail
