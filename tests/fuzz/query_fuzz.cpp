// What the public header (include/troupe/deployment.hpp) decodes for user
// code: Request::query_param (percent and '+' decoding) and Request::header
// on arbitrary input. The input is "<name>\n<query or header value>".
// Never a crash, and a parameter the query names first is found.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <troupe/deployment.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nl = input.find('\n');
  const std::string name = input.substr(0, nl);
  const std::string rest = nl == std::string::npos ? std::string() : input.substr(nl + 1);
  troupe::Request r;
  r.query = rest;
  r.headers = {{name, rest}, {"X-Other", name}};
  (void)r.query_param(name);
  (void)r.query_param(name, "fallback");
  (void)r.query_param(rest);
  (void)r.header(name);
  (void)r.header(rest);
  (void)r.multiplexed_model_id();
  // "p=<rest>" names p, whatever rest holds but '&' (which ends the
  // value): its value is found, so the fallback does not matter.
  if (rest.find('&') == std::string::npos) {
    r.query = "p=" + rest;
    if (r.query_param("p", "a") != r.query_param("p", "b")) {
      std::fprintf(stderr, "query_param did not find the first parameter\n");
      std::abort();
    }
  }
  return 0;
}
