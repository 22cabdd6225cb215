// ReplicaContext::logger: a replica's ctx.log() lines go to the log of the
// process that runs it (component "user", prefixed with the replica's id),
// with the id of the request the calling thread handles
// (runtime/log.hpp). A replica process's log is its file under
// <state-dir>/logs/replicas/.
#pragma once

#include <memory>
#include <string>

#include <troupe/deployment.hpp>

namespace troupe::replica {

std::shared_ptr<LogSink> make_user_log(const std::string& replica_id);

}  // namespace troupe::replica
