"""Qt objects without widgets: the session state, the runner of model jobs, the n sweep, the worker registry."""
