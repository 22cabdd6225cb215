// The controller options.
