// ReplicaContext::logger: a replica's ctx.log() lines go to the log of the
// process that runs it (component "user", prefixed with the replica's id),
// with the id of the request the calling thread handles
// (runtime/log.hpp). A replica process's log is its file under
// <state-dir>/logs/replicas/; an in-process replica's lines are also written
// to a file of its own there.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include <troupe/deployment.hpp>

namespace troupe::replica {

// With `file`, the lines also go to that file (runtime/log.hpp, with_file;
// an in-process replica's own log). A file that cannot be opened is logged,
// and the lines go to the process's log only.
std::shared_ptr<LogSink> make_user_log(const std::string& replica_id,
                                       const std::string& file = "");

// The most an in-process replica's own log file keeps (one older file too).
constexpr size_t kUserLogMaxBytes = 10u << 20;

}  // namespace troupe::replica
