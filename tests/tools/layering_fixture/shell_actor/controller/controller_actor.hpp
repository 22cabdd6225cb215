// The controller actor.
