"""Planning: request parsing, the memory engine, the solver, time and cost, sanity checks, the one recipe of training defaults and plan -> run translation, and the report."""
