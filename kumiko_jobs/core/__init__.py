"""Foundation: settings, errors, the envelope, the run's context variables; imports Django only."""
