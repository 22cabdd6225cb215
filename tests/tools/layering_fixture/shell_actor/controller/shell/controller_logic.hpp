// The plain shell may not depend on the actor that wraps it.
#include "controller/controller_options.hpp"
#include "controller/controller_actor.hpp"
