// Credential verification (runtime/security/credentials.hpp), what the
// controller runs on every write request, on credentials an attacker could
// send: a certificate, a signature and a time of their making. A fresh CA
// and a node identity are made at start; each input changes one part of a
// valid credential (the first byte picks which). Never a crash; and a
// credential signed outside the allowed clock skew is never accepted.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>

#include "runtime/security/certs.hpp"
#include "runtime/security/credentials.hpp"
#include "tools/common/temp_dir.hpp"

using namespace troupe;
using namespace troupe::security;

namespace {

struct Made {
  std::string ca_pem;
  std::string digest;
  Credential valid;
  int64_t now = 0;
};

Made* made = nullptr;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "%s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // The CA, only while the credentials are made (removed on return).
  const troupe::proc::TempDir dir("troupe-credential-fuzz");
  const std::string ca_dir = dir / "ca";
  if (auto st = init_ca(ca_dir); !st.is_ok())
    fail("init_ca: " + st.message());
  if (auto st = issue_certificate(ca_dir, "node-1", Role::node); !st.is_ok())
    fail("issue_certificate: " + st.message());
  made = new Made;
  made->now = static_cast<int64_t>(std::time(nullptr));
  auto identity = load_identity(ca_dir, "node-1", made->now);
  if (!identity)
    fail("load_identity: " + identity.status().message());
  made->ca_pem = identity->ca_pem;
  made->digest = request_digest("register", {"node-1"});
  auto cred = sign(*identity, made->digest, made->now);
  if (!cred)
    fail("sign: " + cred.status().message());
  made->valid = *cred;
  if (!verify(made->ca_pem, made->valid, made->digest, made->now))
    fail("the valid credential does not verify");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 16 * 1024)
    return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  Credential c = made->valid;
  std::string digest = made->digest;
  switch (data[0] % 5) {
    case 0:  // another certificate
      c.certificate_pem = rest;
      break;
    case 1:  // another signature
      c.signature = rest;
      break;
    case 2:  // the certificate with bytes replaced: (offset, byte) pairs
      for (size_t i = 0; i + 2 < rest.size(); i += 3) {
        size_t at = (static_cast<uint8_t>(rest[i]) << 8 | static_cast<uint8_t>(rest[i + 1])) %
                    c.certificate_pem.size();
        c.certificate_pem[at] = rest[i + 2];
      }
      break;
    case 3: {  // another time of signing, and another request
      int64_t t = 0;
      std::memcpy(&t, rest.data(), std::min(rest.size(), sizeof(t)));
      c.timestamp = t;
      if (rest.size() > sizeof(t))
        digest = rest.substr(sizeof(t));
      break;
    }
    default:  // the signature with bytes replaced
      for (size_t i = 0; i + 1 < rest.size() && !c.signature.empty(); i += 2)
        c.signature[static_cast<uint8_t>(rest[i]) % c.signature.size()] = rest[i + 1];
      break;
  }
  auto caller = verify_caller(made->ca_pem, c, digest, made->now);
  if (caller) {
    const int64_t skew = c.timestamp > made->now ? c.timestamp - made->now : made->now - c.timestamp;
    if (skew > 120)
      fail("a credential signed " + std::to_string(skew) + " s away from now was accepted");
  } else if (caller.status().message().empty()) {
    fail("a refusal without a message");
  }
  return 0;
}
